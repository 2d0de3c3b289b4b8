// "Walk me through it": the eight stages of the round trip in order on one run (live in step mode, or a replayed
// recording), each stage highlighted with a narration written for someone who has never seen a transformer, and
// told with the run's own numbers. The engine (or the replay) holds after the first token while the tour walks the
// stages; the last step lets the answer finish and ends on the latency panel: what the waits added up to. A recorded
// turn of an upstream model is told as far as its API showed it: its inside ran on the other server.
import { el, hex, ms, visible } from "./dom.js";
import { gatewayMs, itlParts, ttftParts } from "./latency_parts.js";
import { messageRange } from "./tokens.js";

const quote = (text) => `“${visible(text)}”`;
const pct = (p) => `${(p * 100).toFixed(1)}%`;
const first = (run) => run.steps.get(1);
const answering = (run) => run.upstream && run.steps.size; // an upstream's answer has begun: its inside is past

// stage: the id of the stage it highlights; ready(run): whether the trace has reached it; say(run): the narration;
// waiting: what to say until it is ready.
const STEPS = [
  {
    stage: "request",
    title: "Request",
    ready: () => true,
    say: (run) => {
      const r = run.request;
      const settings = Object.entries(r.params).map(([k, v]) => `${k} ${JSON.stringify(v)}`).join(", ") || "the default settings";
      if (r.prompt !== undefined) {
        return `Your browser packed your text (to be continued as it is, with no chat around it) and the settings (${settings}) ` +
          "into one JSON message and sent it to the server over a WebSocket. Nothing has been computed yet: so far this is just text with labels.";
      }
      const earlier = r.messages.filter((m) => m.role !== "system").length - 1;
      const parts = [
        "your question",
        ...(r.messages.some((m) => m.role === "system") ? ["the system prompt (the instructions the model reads before the conversation)"] : []),
        ...(earlier ? [`${earlier} earlier message${earlier === 1 ? "" : "s"} of this conversation`] : []),
      ];
      return `Your browser packed ${parts.join(", ")} and the settings (${settings}) into one JSON message and sent it ` +
        "to the server over a WebSocket. Nothing has been computed yet: so far this is just text with labels.";
    },
  },
  {
    stage: "gateway",
    title: "Gateway",
    ready: (run) => run.gateway,
    say: (run) => {
      const g = run.gateway;
      const far = run.upstream ? `, run by another server: ${run.upstream.upstream}` : "";
      return `Before any model runs, the server's front door checks who is asking (${g.identity}), counts the request against ` +
        `its rate limit and picks the model that answers (${g.model}${far}). All of that took ${ms(gatewayMs(run))}.`;
    },
  },
  {
    stage: "tokens",
    title: "Tokenization",
    ready: (run) => (run.tokenized && (run.context || run.upstream)) || answering(run),
    say: (run) => {
      if (!run.tokenized) {
        return "A language model cannot read letters: a tokenizer cuts the text into pieces it knows and replaces each by its number. " +
          `This model runs on another server (${run.upstream.upstream}), which does not say how its tokenizer cut your message.`;
      }
      const message = messageRange(run);
      const ids = run.tokenized.ids.slice(message.token_start, message.token_end);
      const pieces = run.tokenized.tokens.slice(message.token_start, message.token_end).map(quote).join(" ");
      return "A language model cannot read letters. A tokenizer cuts the text into pieces it knows (whole words, parts of " +
        `words, punctuation) and replaces each by its number in the model's vocabulary. Your message became ${ids.length} tokens: ` +
        `${pieces}, that is the numbers [${ids.join(", ")}]. From here on the model only sees numbers.`;
    },
  },
  {
    stage: "context",
    title: "Context window",
    ready: (run) => run.context || run.upstream,
    say: (run) => {
      if (run.upstream) {
        return "Your question does not travel alone: a chat template wraps the system prompt, any earlier turns and your message in markers, " +
          `and all of it must fit the model's context window. Here that happens inside the other server, ${run.upstream.upstream}, out of sight.`;
      }
      const c = run.context;
      if (run.request.prompt !== undefined) {
        const text = c.segments.find((segment) => segment.kind === "message");
        const extra = c.prompt_tokens - (text ? text.token_end - text.token_start : c.prompt_tokens);
        return `Your text goes in as it is, with no chat template${extra > 0 ? `, after ${extra === 1 ? "the start-of-text token its model's file asks for" : `${extra} tokens its model's file puts first`}` : ""}: ` +
          `the model reads ${c.prompt_tokens} tokens in a row, each at its position 0, 1, 2, … The order is all the model knows about where a word stands. ` +
          `Up to ${c.context_length.toLocaleString()} positions fit (its context window); ${c.max_tokens} are kept free for the continuation.`;
      }
      return "Your question does not travel alone: a chat template wraps the system prompt, any earlier turns and your " +
        `message in markers, so the model reads ${c.prompt_tokens} tokens in a row, each at its position 0, 1, 2, … ` +
        `The order is all the model knows about where a word stands. Up to ${c.context_length.toLocaleString()} positions fit ` +
        `(its context window); ${c.max_tokens} are kept free for the answer.`;
    },
  },
  {
    stage: "forward",
    title: "Forward pass",
    ready: (run) => run.forwards.length || answering(run),
    say: (run) => {
      const u = run.upstream;
      if (u) {
        return "Now the real work: the tokens go through every layer of the model, attention then feed-forward, to a score for every token it knows. " +
          `Here that ran on ${u.upstream} (${u.upstream_model}), another server: its layers, attention and KV cache are inside that process, and its ` +
          "API sends back only text and, when asked, log-probabilities. So the box stays closed: nothing inside is drawn, and nothing is invented.";
      }
      const prefill = run.forwards[0];
      const layers = prefill.detail ? `all ${prefill.detail.residual_norms.length - 1} layers` : "every layer";
      return `Now the real work: the ${prefill.n_tokens} tokens go through ${layers} of the model at once (the “prefill”, ` +
        `${ms(prefill.duration * 1000)}). Each layer has two halves. In the attention half every token looks back at the ` +
        "tokens before it and takes in what is relevant (the heatmaps show how much it looks at each); in the feed-forward " +
        "half it is processed on its own. What comes out of the last layer is a score for every token the model knows: " +
        "how well it would fit next. The keys and values of every position are kept (the KV cache), so they are never computed again.";
    },
  },
  {
    stage: "sampling",
    title: "Sampling",
    ready: (run) => first(run)?.sampled,
    say: (run) => {
      const s = first(run).sampled;
      const top = s.detail ? s.detail.candidates.slice(0, 3).map((c) => `${quote(c.token)} ${pct(c.raw_prob)}`).join(", ") : null;
      const how = run.upstream ? "The other server drew it, out of sight; these are the probabilities it reported. " : !s.detail ? "" :
        s.detail.draw === null ? "With temperature 0 the likeliest token always wins. " :
        `A random number (${s.detail.draw.toFixed(4)}) picked one of the ${s.detail.kept} tokens left after the filters. `;
      return "The scores become probabilities: how likely each token is to come next. " +
        (top ? `The model's favourites for the first word: ${top}. ` : "") + `${how}It chose ${quote(s.token)} ` +
        `(${s.token_id < 0 ? "" : `token ${s.token_id}, `}probability ${pct(Math.exp(s.logprob))}).`;
    },
  },
  {
    stage: "stream",
    title: "Streaming",
    ready: (run) => run.tokenArrivals.length,
    say: (run) =>
      "The chosen token went back to your browser at once, as its own small message, before the next one is even " +
      `computed: the first token reached this page ${ms(run.clientTtft)} after you pressed Send. That is why answers ` +
      "appear word by word instead of all at the end.",
  },
  {
    stage: "detok",
    title: "Detokenization",
    ready: (run) => first(run)?.text,
    say: (run) => {
      const s = first(run).sampled;
      if (run.upstream) {
        return `The other server turned the token back into text itself and sent ${JSON.stringify(first(run).text.text)} (its bytes: ${hex(s.bytes)}). ` +
          `This recording holds here, after one token. The model goes on feeding ${quote(s.token)} back in, token by token (the loop, ↻), ` +
          "until the end-of-sequence token. Press Next to let it finish.";
      }
      return `Token ${s.token_id} turns back into its bytes (${hex(s.bytes)}) and those into text: ${JSON.stringify(first(run).text.text)}. ` +
        "A token can end in the middle of a character (an emoji, an accent); its bytes then wait for the next token. " +
        `The engine is paused here, after one token. Next it feeds ${quote(s.token)} back in and repeats the forward pass, ` +
        "sampling, streaming and detokenization for every further token (the loop, ↻), until the end-of-sequence token. " +
        "Press Next to let it finish.";
    },
  },
  {
    stage: "latency",
    title: "The clock",
    waiting: "The model is writing the rest of the answer, token by token; the clock's numbers come when it is done…",
    ready: (run) => run.finished,
    say: (run) => {
      const parts = ttftParts(run);
      const total = parts.reduce((a, [, v]) => a + v, 0);
      const ttft = `Time to first token (TTFT) = ${parts.map(([name, v]) => `${name} ${ms(v)}`).join(" + ")} = ${ms(total)} ` +
        `on the server; your browser saw the first token after ${ms(run.clientTtft)} (the rest: sampling it, and the network). `;
      const itl = itlParts(run); // the pause you made after token 1 is left out
      const gap = run.finished.timings.mean_itl;
      const each = run.upstream ? (gap === null ? "" : `Each further token came ${ms(gap * 1000)} after the one before, on average, as the upstream streamed them.`) :
        !itl ? "Too few tokens came to measure the time between tokens." :
        `Each further token (inter-token latency, ITL) = one decode step ${ms(itl.decode)} + sampling ${ms(itl.sampling)} + ` +
        `network ${ms(itl.network)} ≈ ${ms(itl.client)}, the median gap your browser measured` +
        (run.request.step ? " (here the network part includes the page's “next” message: the tour runs in step mode)." : ".");
      const n = run.finished.completion_tokens;
      const counted = run.finished.finish_reason === "stop" ? `${n} tokens counting the end-of-sequence token (${n - 1} with text)` : `${n} tokens`;
      return `${ttft}${each} The answer: ${counted}, ${JSON.stringify(run.finished.text)}.`;
    },
  },
];

export class Tour {
  // box: the tour panel; release(): let the held run go on (the engine's next tokens, or the rest of a replay);
  // ended(): called once when the tour ends (the page puts back what it switched for the tour).
  constructor(box) {
    this.box = box;
    this.run = null;
    this.index = 0;
    this.released = false;
    this.release = () => {};
    this.ended = () => {};
    box.querySelector("[data-tour=next]").addEventListener("click", () => this.go(1));
    box.querySelector("[data-tour=back]").addEventListener("click", () => this.go(-1));
    box.querySelector("[data-tour=end]").addEventListener("click", () => this.end());
  }

  get active() {
    return this.run !== null;
  }

  start(run, release, ended = () => {}) {
    Object.assign(this, { run, release, ended, index: 0, released: false, landed: false });
    this.box.hidden = false;
    document.querySelector(".pipeline").classList.add("touring");
    this.show(true);
  }

  update(run) {
    if (run === this.run) this.show(false);
  }

  go(delta) {
    const index = Math.min(Math.max(this.index + delta, 0), STEPS.length - 1);
    if (index === this.index) return;
    this.index = index;
    if (STEPS[index].stage === "latency" && !this.released) {
      this.released = true;
      this.release();
    }
    this.show(true);
  }

  // The question and the answer so far stay in the tour's box, whatever the page is scrolled to (on a phone the chat is
  // a screen away from the stages).
  sayChat(run) {
    const asked = run.request.messages?.findLast((m) => m.role === "user")?.content ?? "";
    const text = `You asked “${asked}” · the answer so far: “${run.text}”${run.done ? "" : "…"}`;
    const line = this.box.querySelector("[data-tour=chat]");
    if (line.textContent !== text) line.textContent = text;
  }

  end() {
    if (!this.run) return;
    if (!this.released && !this.run.done) this.release(); // never leave the engine paused behind a closed tour
    this.run = null;
    const ended = this.ended;
    this.ended = () => {};
    ended();
    this.box.hidden = true;
    document.querySelector(".pipeline").classList.remove("touring");
    document.querySelectorAll(".stage.touring").forEach((s) => s.classList.remove("touring"));
  }

  show(moved) {
    const step = STEPS[this.index];
    const run = this.run;
    const ready = Boolean(step.ready(run));
    this.sayChat(run);
    const numbered = this.index < 8 ? `Step ${this.index + 1} of 8` : "Last";
    this.box.querySelector("[data-tour=title]").textContent = `${numbered}: ${step.title}`;
    const text = run.error ? `The request ended early: ${run.error.message}` : ready ? step.say(run) : (step.waiting ?? "Waiting for the model to get here…");
    const line = this.box.querySelector("[data-tour=text]");
    if (line.textContent !== text) line.textContent = text;
    this.box.querySelector("[data-tour=next]").disabled = !ready || this.index === STEPS.length - 1;
    this.box.querySelector("[data-tour=back]").disabled = this.index === 0;
    this.box.dataset.stage = step.stage;
    // the last stage is reached when the answer is done, after the stages above it have grown: it is scrolled to then
    if (!moved && !(step.stage === "latency" && ready && !this.landed)) return;
    if (step.stage === "latency" && ready) this.landed = true;
    document.querySelectorAll(".stage.touring").forEach((s) => s.classList.remove("touring"));
    const stage = document.getElementById(`stage-${step.stage}`);
    stage.classList.add("touring");
    stage.scrollIntoView({ block: "start" });
  }
}
