// Draws every stage from a Run. Called on animation frames with the latest state.
import { BpeView } from "./bpe_view.js";
import { clocks } from "./clocks.js";
import { clock, el, field, hex, light, ms, visible } from "./dom.js";
import { attentionCell, drawHeads, queryPosition } from "./attention.js";
import { AttentionView } from "./attention_view.js";
import { ItlChart, NormChart, StepChart } from "./charts.js";
import { copyIdsButton } from "./copy_ids.js";
import { FeedForwardView } from "./feed_forward_view.js";
import { Heatmap } from "./heatmap.js";
import { serverParts } from "./latency_parts.js";
import { drawLayerStack } from "./layer_stack.js";
import { LoopStrip } from "./loop_strip.js";
import { StreamingMarkdown } from "./markdown.js";
import { drawRope } from "./rope_view.js";
import { roving } from "./roving.js";
import { messageRange, SEGMENT_LABELS, tokenAt, tokenChip } from "./tokens.js";

const STREAM_ROWS = 40; // the newest frames listed in the streaming stage
let itlChart = null;
let normChart = null;
let stepChart = null;
let bpeView = null;
const CHART_MS = 250; // charts and the full-detail pictures follow a streaming answer at most this often
// What this run has drawn so far; the widgets live in stage fields that resetStages empties, so they go with it.
const fresh = () => ({
  run: null,
  upstream: false, // the stages show what an upstream server's API reveals instead of the model's inside
  seen: {}, // stage -> the run's version it was drawn at
  forwards: 0,
  pictured: 0,
  picturedDone: false,
  sampled: 0,
  detok: 0,
  frames: 0,
  cacheFinal: false,
  charted: {}, // stage -> when its charts were last drawn
  pending: null,
  attention: null,
  feedForward: null,
  loop: null,
});
const drawn = fresh();
let later = () => {}; // asks for another drawing (a chart that was due later)

// The generated token the token stages (forward pass, sampling, loop, detokenization) show: null follows the newest
// while the answer streams; once it is done they open on the first token (the walkthrough's "The"), unless the
// visitor moved the scrubber.
const cursor = { step: null, moved: false };
const FOLLOWS_CURSOR = ["forward", "sampling", "loop", "detok"];

// The step the token stages show.
function shownStep(run) {
  return Math.min(cursor.step ?? run.lastStep, run.lastStep);
}

// Moves the token stages to generated token `step` (the scrubber, its arrow keys, a click on a loop row).
export function moveCursor(run, step) {
  if (run !== drawn.run || !run.lastStep) return;
  cursor.step = Math.max(1, Math.min(step, run.lastStep));
  cursor.moved = true;
  for (const stage of FOLLOWS_CURSOR) delete drawn.seen[stage];
  Object.assign(drawn, { forwards: -1, pictured: -1, sampled: -1, detok: -1 });
  later();
}

export function resetStages() {
  document.querySelectorAll(".stage").forEach((s) => s.classList.remove("active"));
  document.querySelectorAll(".stage [data-field]").forEach((node) => {
    if (node.tagName === "METER") node.value = 0;
    else if (!["INPUT", "BUTTON"].includes(node.tagName) && !node.classList.contains("chart")) node.replaceChildren();
  });
  document.querySelectorAll(".stage .clock").forEach((c) => (c.textContent = ""));
  document.querySelector('#stage-forward [data-box="full"]').hidden = true;
  showBoxes(false);
  Object.assign(drawn, fresh());
  Object.assign(cursor, { step: null, moved: false });
}

// Each stage's boxes for a model this server runs ("local": drawn from inside it), or for an upstream model
// ("upstream": what its API reveals, and why the rest is out of sight).
function showBoxes(upstream) {
  for (const box of document.querySelectorAll('.stage [data-box="local"], .stage [data-box="upstream"]')) box.hidden = (box.dataset.box === "upstream") !== upstream;
}

// The stages, each drawn from the run alone, so any of them can catch up at any time.
const STAGE_DRAWS = {
  request: drawRequest,
  gateway: drawGateway,
  tokens: (run) => {
    if (run.upstream && !run.tokenized) noTokenizer(run);
    else if (run.tokenized && (run.context || run.upstream)) drawTokens(run);
  },
  context: (run) => {
    if (run.upstream) drawUpstreamContext(run);
    if (!run.tokenized || !run.context) return;
    drawContext(run);
    if (run.finished && !drawn.cacheFinal) {
      drawCache(run); // with the prefill time the cache saved
      drawn.cacheFinal = true;
    }
  },
  forward: (run) => {
    if (run.upstream) drawClosedBox(run);
    if (!run.lastForward) return;
    if (run.forwards.length !== drawn.forwards) drawForward(run, shownForward(run));
    drawForwardPictures(run);
  },
  sampling: drawSampling,
  loop: drawLoop,
  stream: drawStream,
  detok: (run) => {
    drawDetok(run);
    drawRendering(run);
  },
  latency: drawLatency,
};

// A "More" part opened: its pictures are drawn again at the size they now have.
document.addEventListener("toggle", (event) => {
  const stage = event.target.closest?.(".stage");
  if (!stage || !event.target.open || !drawn.run) return;
  delete drawn.seen[stage.dataset.stage];
  drawn.pictured = -1;
  drawn.charted = {};
  later();
}, true);

// Brings the stages up to date with `run`. While it streams only the stages `shown(name)` says are on screen are
// drawn; the rest catch up when they come into view, and all of them once the run is done. `again()` is called
// for a drawing that was put off (a chart due later).
export function drawRun(run, shown = () => true, again = () => {}) {
  later = again;
  if (drawn.run !== run) {
    resetStages();
    drawn.run = run;
  }
  if (run.upstream && !drawn.upstream) {
    drawn.upstream = true;
    showBoxes(true);
  }
  if (run.done && !cursor.moved && cursor.step === null && run.steps.get(1)?.sampled) {
    cursor.step = 1;
    for (const stage of FOLLOWS_CURSOR) delete drawn.seen[stage];
  }
  drawScrubber(run);
  const now = clocks(run);
  for (const [stage, text] of Object.entries(now)) clock(stage, text);
  for (const [stage, draw] of Object.entries(STAGE_DRAWS)) {
    if (drawn.seen[stage] === run.version || !(run.done || shown(stage))) continue;
    drawn.seen[stage] = run.version;
    draw(run);
  }
}

// Whether a stage's charts should be drawn now: always once the run is done, else at most every CHART_MS. A drawing
// put off leaves the stage to be drawn again when it is due.
function due(run, stage) {
  const now = performance.now();
  if (run.done || now - (drawn.charted[stage] ?? -Infinity) >= CHART_MS) {
    drawn.charted[stage] = now;
    return true;
  }
  delete drawn.seen[stage];
  drawn.pending ??= setTimeout(() => {
    drawn.pending = null;
    later();
  }, CHART_MS);
  return false;
}

function drawRequest(run) {
  const json = field("request", "json");
  if (json.textContent) return;
  light("request");
  const heard = run.request.api; // a request the watch page heard of: as it came, through whichever API
  const [title, via] = heard ? ["The request as it came", heard.split(" · ")[1] ?? heard] : ["This page's message", "WebSocket"];
  field("request", "json-title").replaceChildren(`${title} `, el("span", { class: "muted" }, `(${via})`));
  const overHttp = Boolean(heard) && run.request.endpoint !== "ws.chat"; // the watch page shows the page's turns too
  for (const explain of document.querySelectorAll("#stage-request [data-explain]")) explain.hidden = (explain.dataset.explain === "api") !== overHttp;
  if (heard) {
    const body = run.request.body;
    json.textContent = typeof body === "string" ? body : JSON.stringify(body ?? {}, null, 2);
    field("request", "api-title").replaceChildren("Through ", el("span", { class: "api-name" }, heard.split(" · ")[0]));
    const { source, model, request_id: id } = run.request;
    field("request", "api").textContent = `${heard}\nfrom ${source || "?"} · model ${model || "?"}\nrequest id ${id}`;
    return;
  }
  // completing text, the socket carried the prompt alone (the page keeps the messages for drawing the turn)
  json.textContent = JSON.stringify(run.request.prompt === undefined ? run.request : { ...run.request, messages: undefined }, null, 2);
  field("request", "api-title").replaceChildren("The same request through the API ", el("span", { class: "muted" }, "(what an SDK sends)"));
  const endpoint = run.request.prompt === undefined ? "/v1/chat/completions" : "/v1/completions";
  field("request", "api").textContent = `POST ${endpoint}\nAuthorization: Bearer <your key>\n\n${JSON.stringify(apiRequest(run.request), null, 2)}`;
}

// The page's turn as the API takes it: the same model, messages (or, completing text, the prompt) and sampling fields,
// streamed, with the usage chunk at the end (the page's own options, level and step, are the page's).
function apiRequest(request) {
  const more = request.continue_final_message ? { continue_final_message: true } : {};
  const input = request.prompt === undefined ? { messages: request.messages } : { prompt: request.prompt };
  return { model: request.model, ...input, ...request.params, ...more, stream: true, stream_options: { include_usage: true } };
}

function drawGateway(run) {
  drawQueue(run);
  const g = run.gateway;
  if (!g) return;
  const checks = field("gateway", "checks");
  if (!checks.childElementCount) {
    light("gateway");
    for (const stage of g.stages) checks.append(el("li", {}, `${stage.name} — ${ms(stage.ms)}${stage.detail.who ? ` (${stage.detail.who})` : ""}`));
    const limit = g.limits.requests_per_minute;
    const meter = field("gateway", "rate");
    const after = g.rate.requests_after ?? 0;
    meter.max = limit || 1;
    meter.value = limit ? after : 0;
    field("gateway", "rate-text").textContent = limit ? `${g.rate.requests_before ?? 0} → ${after} of ${limit}` : "unlimited";
    if (g.prices) field("gateway", "price").textContent = `${g.model} costs ${usd(g.prices.input_per_million)} per million input tokens and ${usd(g.prices.output_per_million)} per million output tokens`;
  }
  drawRoute(run, g);
  if (run.usage && !field("gateway", "usage").textContent) {
    const r = run.usage.record;
    for (const stage of run.usage.stages.filter((s) => s.name in LATER_STAGES)) checks.append(el("li", {}, `${stage.name} — ${ms(stage.ms)}${LATER_STAGES[stage.name]}`));
    field("gateway", "usage").textContent =
      `usage log #${r.id}: ${r.status} ${r.finish_reason}, ${r.prompt_tokens} + ${r.completion_tokens} tokens, TTFT ${ms(r.ttft_ms)}, total ${ms(r.total_ms)}`;
    const p = g.prices;
    if (p && r.cost_usd !== undefined) {
      field("gateway", "cost").textContent = `cost of this request: ${r.prompt_tokens} input tokens × ${usd(p.input_per_million)}/M + ` +
        `${r.completion_tokens} output tokens × ${usd(p.output_per_million)}/M = ${usd(r.cost_usd)}`;
    }
  }
}

// The gateway's own stages after its checks, as the usage frame reports them (an upstream model's: what its time went on).
const LATER_STAGES = { upstream: " (choosing its server, asking its tokenizer, sending the request)", usage_log: "" };

// Where the turn went once taken: this server's worker on the model's channel, or, for an upstream model, the routing
// decision: which of its servers answered, and each one tried before it, with why it failed.
function drawRoute(run, g) {
  const u = run.upstream;
  let text = `routed to ${g.model}`;
  if (u) {
    const fallback = u.model === g.model ? "" : ` for the fallback model ${u.model}`;
    const tries = u.tried.length ? `after ${u.tried.length} failed (below)` : "the first server tried";
    const order = u.replicas.length > 1 ? " (the one with the fewest requests in flight is tried first)" : "";
    text += ` · answered by ${u.upstream}${fallback} (model ${u.upstream_model} at ${u.url}), ${tries} · ${g.model}'s replicas: ${u.replicas.join(", ")}${order}`;
  } else if (run.accepted) {
    text += ` on channel ${g.channel}${run.accepted.worker ? ` · served by worker ${run.accepted.worker}` : ""}`;
  }
  const route = field("gateway", "route");
  if (route.textContent !== text) route.textContent = text;
  const tried = field("gateway", "tried");
  if (u && tried.childElementCount !== u.tried.length) {
    tried.replaceChildren(...u.tried.map((t) => el("li", {}, `tried first: ${t.upstream}${t.model === g.model ? "" : ` (${t.model})`} — ${t.error}`)));
  }
}

// US dollars with the digits a tiny amount needs: $0.40, $0.0000063.
function usd(value) {
  if (!value) return "$0";
  const digits = Math.max(2, Math.min(12, 2 - Math.floor(Math.log10(value)))); // two significant digits at least
  return `$${value.toFixed(digits).replace(/(\.\d\d\d*?)0+$/, "$1")}`;
}

// Every slot of the batch is taken: the request waits in the worker's queue, and the page says where.
function drawQueue(run) {
  const line = field("gateway", "queue");
  const text = run.waiting === null ? "" : run.waiting === 0 ? "server busy — you are next in the queue" : `server busy — ${run.waiting} requests ahead of you`;
  if (line.textContent !== text) line.textContent = text;
  line.hidden = !text;
}

function drawTokens(run) {
  const chips = field("tokens", "chips");
  if (chips.childElementCount) return;
  light("tokens");
  const message = messageRange(run);
  const ids = run.tokenized.ids;
  for (let i = message.token_start; i < message.token_end; i++) {
    const token = tokenAt(run, i);
    // your message's colour, as everywhere on the page, in two shades: where one token ends and the next begins
    const chip = tokenChip(token, { colour: `seg-message${(i - message.token_start) % 2 ? " alt" : ""}` });
    chip.title = `id ${token.id} · position ${i} · bytes ${hex(Array.from(new TextEncoder().encode(token.text)))}`;
    chips.append(chip);
  }
  roving(chips);
  if (!run.upstream) { // an upstream model's merges are the upstream's own: the page cannot ask for them
    bpeView ??= new BpeView(); // one for the page: it listens for the worker's answers
    bpeView.update(run, message);
  }
  const count = message.token_end - message.token_start;
  field("tokens", "count").replaceChildren(
    document.createTextNode(`${count} tokens in your message · ${ids.length} in the whole prompt `),
    copyIdsButton(ids.slice(message.token_start, message.token_end)),
  );
}

// An upstream that exposes no tokenizer: its tokens are not drawn (another model's would be a guess), once the answer
// has begun without them.
function noTokenizer(run) {
  const count = field("tokens", "count");
  if (!run.steps.size || count.textContent) return;
  light("tokens");
  count.textContent = `${run.upstream.upstream} exposes no tokenizer this server can ask (Roundtrip's /v1/tokenize, llama-server's or vLLM's /tokenize), ` +
    "so its tokens are not drawn here: another model's tokenizer would only guess them.";
}

// An upstream model's context window is built inside the upstream server: the page says so, with the prompt's length
// as its tokenizer or its usage counted it.
function drawUpstreamContext(run) {
  const line = field("context", "upstream-count");
  const f = run.finished;
  const cached = f?.cached_tokens ? `, ${f.cached_tokens} of them from its prefix cache` : "";
  const text = f ? `Its usage counted ${f.prompt_tokens} prompt tokens${cached}.` : run.tokenized ? `Its tokenizer makes the prompt ${run.tokenized.ids.length} tokens.` : "";
  if (line.textContent === text) return;
  light("context");
  line.textContent = text;
}

function drawContext(run) {
  const segments = field("context", "segments");
  if (segments.childElementCount) return;
  light("context");
  const c = run.context;
  for (const s of c.segments) {
    const n = s.token_end - s.token_start;
    const block = el("div", { class: `segment ${s.kind}`, title: `${SEGMENT_LABELS[s.kind]}: positions ${s.token_start}–${s.token_end - 1}`, style: `flex-grow:${n}` });
    block.append(el("span", {}, String(n))); // a count always fits; the names are in the legend below
    segments.append(block);
  }
  const totals = new Map();
  for (const s of c.segments) totals.set(s.kind, (totals.get(s.kind) ?? 0) + s.token_end - s.token_start);
  field("context", "legend").replaceChildren(...[...totals].map(([kind, n]) => el("span", { class: `seg-${kind}` }, `${SEGMENT_LABELS[kind]} ${n}`)));
  const positions = field("context", "positions");
  for (let p = 0; p < c.prompt_tokens; p++) positions.append(tokenChip(tokenAt(run, p), { position: true }));
  roving(positions);
  const pct = (n) => (n / c.context_length) * 100;
  const fill = field("context", "fill");
  fill.replaceChildren(
    ...(c.cached_tokens ? [el("div", { class: "cached", style: `width:${pct(c.cached_tokens)}%`, title: `positions 0–${c.cached_tokens - 1}: from the prefix cache` })] : []),
    el("div", { class: "used", style: `width:${Math.max(pct(c.prompt_tokens - c.cached_tokens), 0.5)}%`, title: "computed by this request's prefill" }),
    el("div", { class: "reserved", style: `width:${pct(c.max_tokens)}%`, title: "room kept for the answer" }),
  );
  field("context", "fill-text").textContent =
    `${c.prompt_tokens} prompt tokens + up to ${c.max_tokens} for the answer, of ${c.context_length}` +
    (c.dropped_messages ? ` · ${c.dropped_messages} earlier messages left out` : "");
  drawCache(run);
}

// Which positions the prefix cache supplied, and (once the prompt is in) the prefill time that saved.
function drawCache(run) {
  const c = run.context;
  const line = field("context", "cache");
  if (!c.cached_tokens) {
    line.textContent = "prefix cache: no earlier request shared this prompt's start, so every position is computed";
    return;
  }
  const saved = run.finished ? ` — about ${ms(run.finished.timings.prefill_saved * 1000)} of prefill saved (at this request's own prefill rate)` : "";
  line.textContent = `prefix cache: positions 0–${c.cached_tokens - 1} (${c.cached_tokens} of ${c.prompt_tokens}) were reused from an earlier request instead of recomputed${saved}`;
}

// An upstream model's forward pass, drawn as the closed box it is: which server ran it, what went in and what came out
// as far as its API says. Nothing of its inside is drawn (stage 5's text says why).
function drawClosedBox(run) {
  const u = run.upstream;
  light("forward");
  field("forward", "upstream-server").textContent = `${u.upstream} (${u.upstream_model})`;
  const f = run.finished;
  const prompt = run.tokenized ? `${run.tokenized.ids.length} tokens by its tokenizer` : f ? `${f.prompt_tokens} tokens by its usage` : "its length not known yet";
  field("forward", "upstream-in").textContent = `in: the conversation as JSON over HTTP (${prompt})`;
  const tokens = run.steps.size;
  const logprobs = run.lastSampled?.detail ? `, each with its log-probability and its top ${run.lastSampled.detail.kept} alternatives` : "";
  const usage = f ? `; then the usage: ${f.prompt_tokens} prompt + ${f.completion_tokens} completion tokens` : "";
  field("forward", "upstream-out").textContent = `out: ${tokens} token${tokens === 1 ? "" : "s"} of text${logprobs}${usage}`;
  if (f) field("forward", "upstream-time").textContent = `Timed from outside, at ${u.url}: the first token came ${ms(f.timings.ttft * 1000)} after the request went out, the rest in ${ms(f.timings.decode * 1000)}.`;
}

// The forward pass that produced the shown token (the prefill for the first), else the newest.
function shownForward(run) {
  return run.steps.get(shownStep(run))?.forward ?? run.lastForward;
}

// The scrubber over the answer's tokens: where the token stages are, and a way to move them together.
const scrubber = {
  box: document.getElementById("token-cursor"),
  pick: document.getElementById("cursor-pick"),
  text: document.getElementById("cursor-text"),
};
scrubber.pick?.addEventListener("input", () => drawn.run && moveCursor(drawn.run, Number(scrubber.pick.value)));
scrubber.box?.addEventListener("click", (event) => {
  const by = Number(event.target.closest("[data-cursor]")?.dataset.cursor);
  if (by && drawn.run) moveCursor(drawn.run, shownStep(drawn.run) + by);
});

function drawScrubber(run) {
  if (!scrubber.box) return;
  const n = shownStep(run);
  scrubber.box.hidden = !run.lastStep;
  if (!run.lastStep) return;
  if (scrubber.pick.max !== String(run.lastStep)) scrubber.pick.max = String(run.lastStep);
  if (scrubber.pick.value !== String(n)) scrubber.pick.value = String(n);
  const s = run.steps.get(n)?.sampled;
  const text = s ? `token ${n} of ${run.lastStep}: ${JSON.stringify(s.token)} (${(Math.exp(s.logprob) * 100).toFixed(1)}%)${cursor.step === null ? " · following the newest" : ""}` : "";
  if (scrubber.text.textContent !== text) scrubber.text.textContent = text;
}

function drawForward(run, f) {
  drawn.forwards = run.forwards.length;
  light("forward");
  field("forward", "step").textContent =
    f.phase === "prefill"
      ? `prefill: ${f.n_tokens} tokens through every layer in one pass`
      : `decode step ${f.step}: 1 token at position ${f.position}, reading ${f.kv_length - 1} cached positions`;
  drawPlain(run, f);
  drawLayerStack(field("forward", "layers"), f.detail ? f.detail.residual_norms.length - 1 : (run.context?.n_layers ?? 0), f);
  drawRope(field("forward", "rope"), run, queryPosition(f), f.kv_length);
  const contextLength = run.context?.context_length ?? f.kv_length;
  field("forward", "kv").style.width = `${Math.min(100, (f.kv_length / contextLength) * 100)}%`;
  field("forward", "kv-text").textContent = `${f.kv_length} positions cached`;
  if (run.accepted?.weights) field("forward", "weights").textContent = `weights: ${run.accepted.weights}`;
  drawBatch(run, f);
}

// The forward pass in plain words, with this pass's own numbers: what went in, what every layer did to it, what
// came out. The pictures behind "More" show each part in detail.
function drawPlain(run, f) {
  const c = run.context;
  const n = f.step + 1; // the token this pass produced
  const reused = c?.cached_tokens ? ` not already in the prefix cache (${c.cached_tokens} were)` : "";
  const fed = f.phase === "prefill" ? `the prompt's ${f.n_tokens} tokens${reused}, all in one pass (the prefill)` : `“${tokenAt(run, f.position)?.text ? visible(tokenAt(run, f.position).text) : "?"}”, the answer's latest token, at position ${f.position}`;
  const width = c?.dim ? `, each carried as a list of ${c.dim.toLocaleString()} numbers` : "";
  const items = [["in", `In goes ${fed}${width}.`]];
  const layers = c?.n_layers ?? (f.detail ? f.detail.residual_norms.length - 1 : "every");
  let link = "";
  const strongest = f.detail ? strongestLink(run, f.detail.attention) : null;
  if (strongest) link = ` (in this pass the strongest link: layer ${strongest.layer}, head ${strongest.head} gave ${(strongest.weight * 100).toFixed(0)}% of “${strongest.query}”'s attention to “${strongest.key}”)`;
  items.push(["layers", `Through ${layers} layers, each twice: attention gathers from the earlier tokens${link}, then the feed-forward half${c?.ffn_dim ? `, ${c.ffn_dim.toLocaleString()} neurons,` : ""} refines the token on its own.`]);
  const s = run.steps.get(n)?.sampled;
  const top = s?.detail ? s.detail.candidates.slice(0, 3).map((x) => `“${visible(x.token)}” ${(x.raw_prob * 100).toFixed(1)}%`).join(", ") : null;
  const vocab = c?.vocab_size ? `each of the ${c.vocab_size.toLocaleString()} tokens it knows` : "every token it knows";
  items.push(["out", `Out comes a score for ${vocab}, the likeliest next${top ? `: ${top}` : ""}.`]);
  if (s) items.push(["pick", `Sampling (the next stage) picks token ${n}: ${JSON.stringify(s.token)}.`]);
  field("forward", "plain").replaceChildren(...items.map(([kind, text]) => el("li", { class: `plain-${kind}` }, text)));
}

// The pass's strongest attention weight from its query to a key other than position 0 (the sink) and itself.
function strongestLink(run, attention) {
  const [layers, heads] = attention.shape;
  const query = attention.kv_length - 1;
  let best = null;
  attention.positions.forEach((p, i) => {
    if (p === 0 || p === query) return;
    for (let layer = 0; layer < layers; layer++) {
      for (let head = 0; head < heads; head++) {
        const weight = attentionCell(attention, layer, head, i).weight;
        if (!best || weight > best.weight) best = { layer, head, weight, key: p };
      }
    }
  });
  if (!best) return null;
  return { ...best, query: visible(tokenAt(run, query)?.text ?? "?"), key: visible(tokenAt(run, best.key)?.text ?? "?") };
}

// The step timeline and, at full detail, the attention, feed-forward and norm pictures: redrawn when due.
function drawForwardPictures(run) {
  const count = run.forwards.length;
  if (drawn.pictured === count && !(run.done && !drawn.picturedDone)) return;
  if (!due(run, "forward")) return;
  drawn.pictured = count;
  drawn.picturedDone = run.done;
  if (run.batches.size) {
    stepChart ??= new StepChart(field("forward", "steps"));
    stepChart.update([...run.batches.values()]);
  }
  const forward = shownForward(run);
  if (forward.detail) drawFull(run, forward);
}

// The engine runs every active request in one batched forward per step: with whom this one ran, and the timeline.
function drawBatch(run, f) {
  const b = run.batchOf(f);
  if (!b) return;
  const others = b.batch_size - 1;
  field("forward", "batch").textContent =
    `decoded together with ${others} other request${others === 1 ? "" : "s"} in engine step ${b.step}: ` +
    `${b.batch_size} sequence${b.batch_size === 1 ? "" : "s"}, ${b.prefill_tokens} prompt + ${b.decode_tokens} decode tokens in one forward of ${ms(b.duration * 1000)}`;
}

function drawFull(run, forward) {
  document.querySelector('#stage-forward [data-box="full"]').hidden = false;
  drawn.feedForward ??= new FeedForwardView();
  drawn.attention ??= new AttentionView((forward, layer) => {
    drawn.feedForward.draw(run, forward, layer);
    drawRope(field("forward", "rope"), run, queryPosition(forward), forward.kv_length); // the token the views show
  });
  drawn.attention.update(run, forward);
  normChart ??= new NormChart(field("forward", "norms"));
  normChart.update(forward.detail.residual_norms);
}

function drawSampling(run) {
  const n = shownStep(run);
  const s = run.steps.get(n)?.sampled;
  if (!s || drawn.sampled === n) return;
  drawn.sampled = n;
  light("sampling");
  const bars = field("sampling", "bars");
  const d = s.detail;
  if (!d) {
    bars.replaceChildren();
    if (run.upstream) field("sampling", "decision").textContent = `the upstream sent no log-probabilities for token ${n}, only its text ${JSON.stringify(s.token)}`;
    return;
  }
  const reported = (c) => `${(c.raw_prob * 100).toFixed(1)}%`;
  const reshaped = (c) => `${reported(c)} → ${(c.adjusted_prob * 100).toFixed(1)}%${c.bias ? ` (bias ${c.bias > 0 ? "+" : ""}${c.bias})` : ""}${c.removed_by ? ` (cut by ${c.removed_by})` : ""}`;
  bars.replaceChildren(
    ...d.candidates.map((c) => {
      const row = el("div", { class: `bar${isChosen(c, s) ? " chosen" : ""}${c.removed_by ? " removed" : ""}`, "data-token": String(c.token_id) });
      row.append(
        el("span", { class: "tok" }, visible(c.token)),
        el("span", { class: "track" }),
        el("span", { class: "val" }, run.upstream ? reported(c) : reshaped(c)),
      );
      const track = row.querySelector(".track");
      track.append(el("i", { class: "raw", style: `width:${c.raw_prob * 100}%` }), el("i", { class: "adj", style: `width:${c.adjusted_prob * 100}%` }));
      return row;
    }),
  );
  if (run.upstream) {
    field("sampling", "decision").textContent = `the upstream's reported top ${d.kept} log-probabilities for token ${n} (its filters and its draw are not visible)` +
      ` · it chose ${JSON.stringify(s.token)} (logprob ${s.logprob.toFixed(3)}${s.token_id < 0 ? "" : `, id ${s.token_id}`})`;
    return;
  }
  field("sampling", "decision").textContent =
    (d.draw === null ? "greedy (temperature 0): the most likely token wins" : `random draw ${d.draw.toFixed(4)} among ${d.kept} kept tokens`) +
    ` · chose ${JSON.stringify(s.token)} (rank ${s.rank}, logprob ${s.logprob.toFixed(3)}) · end-of-turn probability ${(d.eos_prob * 100).toFixed(2)}%` +
    (d.grammar_cut ? ` · the grammar cut ${d.grammar_cut.toLocaleString()} tokens (mask ${ms(d.mask_seconds * 1000)})` : "");
}

// Whether candidate `c` is the token sampled: by id, or by text where an upstream named no ids (-1).
function isChosen(c, s) {
  return s.token_id < 0 ? c.token === s.token : c.token_id === s.token_id;
}

function drawLoop(run) {
  if (!run.lastSampled) return;
  light("loop");
  drawn.loop ??= new LoopStrip(field("loop", "strip"));
  drawn.loop.update(run); // says why the loop ended when max_tokens cut it
  drawn.loop.mark(shownStep(run), (step) => moveCursor(run, step), cursor.step !== null);
}

function drawStream(run) {
  const frames = field("stream", "frames");
  const fresh = run.frames.slice(Math.max(drawn.frames, run.frames.length - 200)).filter(({ frame }) => frame.type === "trace" && frame.event.event === "text");
  drawn.frames = run.frames.length;
  const items = fresh.slice(-STREAM_ROWS).map(({ at, frame }) => el("li", {}, `+${at.toFixed(0)} ms  token ${frame.event.step}: ${JSON.stringify(frame.event.text)}`));
  frames.prepend(...items.reverse());
  while (frames.childElementCount > STREAM_ROWS) frames.lastElementChild.remove();
  if (fresh.length) light("stream");
  const itls = run.clientItls;
  if (itls.length) {
    const mean = itls.reduce((a, b) => a + b, 0) / itls.length;
    const end = run.finished?.finish_reason === "stop" ? " (the end-of-sequence token has none: the answer's count includes it)" : "";
    field("stream", "rate").textContent = `${run.tokenArrivals.length} tokens with text${end} · ${(1000 / mean).toFixed(1)} tokens/s in the browser`;
  }
  const sse = field("stream", "sse");
  if (run.sse && !sse.textContent) sse.textContent = run.sse;
  if (!due(run, "stream")) return;
  itlChart ??= new ItlChart(field("stream", "itl-chart"));
  const timings = run.finished?.timings;
  const serverTimes = timings?.token_times ?? [];
  const serverItls = serverTimes.slice(1).map((t, i) => (t - serverTimes[i] - (timings.pauses?.[i] ?? 0)) * 1000);
  // the reader's pauses (the page's own immediate "next"s, a fraction of a millisecond each, are not worth a mention)
  const pauses = run.clientPauses.map((p, i) => [i + 2, p]).filter(([, p]) => p >= 1);
  itlChart.update(itls, serverItls, pauses);
  field("stream", "pauses").textContent = pauses.length
    ? `Paused, and left out of the latencies (step mode waited for “next”): ${pauses.slice(0, 3).map(([n, p]) => `${ms(p)} before token ${n}`).join(", ")}${pauses.length > 3 ? `, and ${pauses.length - 3} more` : ""}`
    : "";
}

function drawDetok(run) {
  const n = shownStep(run);
  const step = run.steps.get(n);
  const s = step?.sampled;
  const t = step?.text;
  if (!s || (!t && !s.is_stop) || drawn.detok === n) return;
  drawn.detok = n;
  light("detok");
  field("detok", "bytes").textContent = `${hex(s.bytes)}  (token ${n}, ${JSON.stringify(s.token)})`;
  field("detok", "pending").textContent = t?.pending_bytes.length ? hex(t.pending_bytes) : "none";
  field("detok", "held").textContent = t?.held_text ? JSON.stringify(t.held_text) : "none";
  field("detok", "appended").textContent = t ? JSON.stringify(t.text) : "none: the end-of-sequence token ends the answer and adds no text";
}

// Once the answer is done: its text exactly as the tokens spell it, beside what the chat's renderer makes of it.
function drawRendering(run) {
  const raw = field("detok", "raw");
  if (raw.textContent || !run.done || !run.finished) return;
  raw.textContent = run.finished.text;
  const rendered = new StreamingMarkdown(field("detok", "rendered"));
  rendered.update(run.finished.text);
  rendered.finish();
}

function drawLatency(run) {
  const f = run.finished;
  const itls = run.clientItls;
  const mean = itls.length ? itls.reduce((a, b) => a + b, 0) / itls.length : null;
  field("latency", "ttft-client").textContent = ms(run.clientTtft);
  field("latency", "itl-client").textContent = ms(mean);
  field("latency", "tps-client").textContent = mean ? (1000 / mean).toFixed(1) : "—";
  if (run.usage) field("latency", "ttft-server").textContent = ms(run.usage.record.ttft_ms);
  if (!f || field("latency", "waterfall").childElementCount) return;
  light("latency");
  const t = f.timings;
  field("latency", "itl-server").textContent = t.mean_itl === null ? "—" : ms(t.mean_itl * 1000);
  field("latency", "tps-server").textContent = t.decode_tokens_per_s ? t.decode_tokens_per_s.toFixed(1) : "—";
  const parts = serverParts(run);
  const server = parts.reduce((sum, [, v]) => sum + v, 0);
  const paused = run.clientPauses.reduce((a, b) => a + b, 0); // the reader's time in step mode is not latency
  const client = run.tokenArrivals.length && run.sentAt !== null ? run.tokenArrivals[run.tokenArrivals.length - 1] - run.sentAt - paused : server;
  parts.push(["network & other", Math.max(0, client - server)]);
  const total = parts.reduce((sum, [, v]) => sum + v, 0) || 1;
  const waterfall = field("latency", "waterfall");
  waterfall.replaceChildren(
    ...parts.map(([name, value]) => el("span", { class: `wf ${name.split(" ")[0]}`, style: `flex-grow:${value / total}`, title: `${name}: ${ms(value)}` })),
  );
  const legend = el("p", { class: "muted" });
  const sums = {};
  for (const [name, value] of parts) sums[name] = (sums[name] ?? 0) + value;
  legend.textContent = Object.entries(sums).map(([n, v]) => `${n} ${ms(v)}`).join(" · ") + (paused >= 1 ? ` (and ${ms(paused)} paused in step mode, left out)` : "");
  waterfall.append(legend);
}

// The full record of one generated token, for the dialog opened by clicking it.
export function tokenDetail(run, stepNumber) {
  const step = run.steps.get(stepNumber);
  const box = el("div");
  if (!step?.sampled) return box;
  const s = step.sampled;
  const u = run.upstream;
  box.append(el("h3", {}, `Token ${stepNumber}: ${JSON.stringify(s.token)} (${s.token_id < 0 ? "the upstream named no id" : `id ${s.token_id}`})`));
  box.append(el("p", {}, `logprob ${s.logprob.toFixed(4)} · rank ${s.rank} · ${u ? `sampled on ${u.upstream}, out of sight` : `sampled in ${ms(s.duration * 1000)}`}`));
  if (step.forward) box.append(el("p", {}, `forward pass: ${step.forward.phase}, ${ms(step.forward.duration * 1000)}, ${step.forward.kv_length} positions cached`));
  if (s.detail) {
    const list = el("ol");
    for (const c of s.detail.candidates) {
      list.append(el("li", {}, u ? `${JSON.stringify(c.token)} ${(c.raw_prob * 100).toFixed(2)}%` : `${JSON.stringify(c.token)} raw ${(c.raw_prob * 100).toFixed(2)}% · adjusted ${(c.adjusted_prob * 100).toFixed(2)}%` +
        `${c.removed_by ? ` · cut by ${c.removed_by}` : ` · final ${(c.final_prob * 100).toFixed(2)}%`}`));
    }
    const how = u ? "the upstream's reported top alternatives" : s.detail.draw === null ? "greedy choice" : `draw ${s.detail.draw.toFixed(4)}`;
    box.append(el("p", {}, how), list);
  }
  if (step.forward?.detail) {
    const attention = step.forward.detail.attention;
    const host = el("div");
    box.append(el("p", { class: "muted" }, "last layer's attention for the pass that produced this token"), host);
    drawHeads(new Heatmap(host, "last layer's attention, every head"), run, attention, attention.shape[0] - 1);
    box.append(el("p", {}, `logit lens, last layers: ${step.forward.detail.logit_lens.slice(-5).map((g) => visible(g.token)).join(" → ")}`));
  }
  if (step.text) box.append(el("p", {}, `released text ${JSON.stringify(step.text.text)}${step.text.pending_bytes.length ? `, waiting bytes ${hex(step.text.pending_bytes)}` : ""}`));
  return box;
}

// Recomputed full detail for one token of `run`: a layer picker over its attention, both halves of every layer, the
// picked layer's feed-forward neurons, and the logit lens at every layer.
export function inspectionView(detail, run) {
  const attention = detail.attention;
  const box = el("div", { class: "inspection" });
  const host = el("div", { class: "inspect-heatmap" });
  const label = el("span");
  const pick = el("input", { type: "range", min: 0, max: attention.shape[0] - 1, value: attention.shape[0] - 1 });
  const picker = el("label", {}, "Layer ");
  picker.append(pick, label);
  const nodes = { halves: el("div", { class: "chart" }), text: el("p", { class: "muted" }), neurons: el("ol", { class: "neurons" }), lens: el("div") };
  box.append(picker, host, nodes.halves, nodes.text, el("p", { class: "muted" }, "the picked layer's most active feed-forward neurons, by |silu(gate) × up|"), nodes.neurons, nodes.lens);
  const heatmap = new Heatmap(host, "attention of every head for this token");
  const halves = new FeedForwardView(nodes);
  const paint = () => {
    label.textContent = `layer ${pick.value} · ${attention.shape[1]} heads over ${attention.shape[2]} of ${attention.kv_length} positions`;
    drawHeads(heatmap, run, attention, Number(pick.value));
    halves.draw(run, { detail, kv_length: attention.kv_length }, Number(pick.value));
  };
  pick.addEventListener("input", paint);
  paint();
  return box;
}
