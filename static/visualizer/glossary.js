// Every term the page uses, said in one or two plain sentences. A term in a template or a drawn view is written
// <dfn data-term="…">: it gets its definition as a tooltip (hover), and a click, Enter or a tap shows it in a small
// box beside it, for touch screens and keyboards.
import { el } from "./dom.js";

const TERMS = {
  token: "A piece of text the model knows as one unit: a word, part of a word, a space with a word, or punctuation. The model reads and writes tokens, never letters.",
  "token id": "A token's number in the model's vocabulary. The model only ever sees these numbers.",
  BPE: "Byte-pair encoding: the tokenizer starts from a word's bytes and applies learned merges, most frequent pair first, until no merge applies; what is left are the tokens.",
  "chat template": "Markup the model was trained with, wrapped around each message (who speaks, where a turn ends), so a chat becomes one long text.",
  "system prompt": "Instructions the model reads before the conversation; when none is given, the chat template may put in its own default.",
  "context window": "The most tokens the model can read at once: the prompt and the answer together must fit.",
  position: "A token's place in the context, counted from 0. The model knows word order only from these numbers.",
  RoPE: "Rotary position embedding: each query and key is rotated by an angle that grows with its position, so attention can tell near from far.",
  layer: "One of the model's identical-looking blocks; each has an attention half and a feed-forward half, and the token passes through all of them in turn.",
  "residual stream": "The list of numbers that carries one token up through the layers; each half of each layer adds its result to it instead of replacing it.",
  "‖Δh‖": "The size (length) of what one half of a layer added to the residual stream: a big number means that half changed the token's numbers a lot.",
  attention: "The half of a layer where a token looks at itself and the tokens before it and takes in a weighted mix of them; the weights say how much it reads from each.",
  query: "In attention, the token that is looking: it asks which earlier tokens matter to it.",
  key: "In attention, a token being looked at: how well its key matches the query decides its weight.",
  head: "One of several attentions run side by side in a layer, each free to look for something different (one may track the subject, another the previous word).",
  "key/value group": "Several query heads that share one set of keys and values (grouped-query attention), which makes the KV cache smaller.",
  "attention sink": "Position 0, where many heads park most of their weight when nothing else is relevant to them; it carries little information of its own.",
  "feed-forward": "The half of a layer where each token is processed on its own, through thousands of small units (neurons).",
  SwiGLU: "The feed-forward half's shape: each neuron multiplies a gated value, silu(gate), by a second value, up; the products are mixed back into the stream.",
  neuron: "One unit of the feed-forward half; its activation is silu(gate) × up, and the most active ones shape what the half adds.",
  "logit lens": "Reading the residual stream out early, as if that layer were the last: it shows the model's best guess forming layer by layer.",
  logits: "The scores the last layer gives every token in the vocabulary; softmax turns them into probabilities.",
  prefill: "The first forward pass, over the whole prompt at once; it fills the KV cache and gives the first token's probabilities.",
  decode: "Every later forward pass: one new token at a time, reading the earlier ones from the KV cache.",
  "KV cache": "The keys and values of every earlier position, kept in memory so later tokens can attend to them without recomputing them.",
  "prefix cache": "Keys and values kept from an earlier request that started with the same tokens, reused instead of recomputed.",
  temperature: "Divides the scores before they become probabilities: below 1 the favourite gets stronger, above 1 the choice gets more even; 0 means always the favourite.",
  "top-p": "Keeps the fewest likeliest tokens whose probabilities add up to p and drops the rest.",
  greedy: "Always the likeliest token (temperature 0): the same answer every time.",
  "end-of-sequence token": "A special token the model emits to say its turn is over; it is counted as a token but has no text.",
  SSE: "Server-sent events: an HTTP response that stays open and sends one `data: {…}` line per piece of the answer, as the API's streaming does.",
  TTFT: "Time to first token: from sending the request to the first piece of the answer arriving.",
  ITL: "Inter-token latency: the time between one token arriving and the next.",
  "engine step": "One batched forward pass of the server's engine: the next token of every running request at once.",
  batch: "The requests the engine runs together in one forward pass, so many conversations share the model.",
  int4: "Weights stored as 4-bit numbers with a scale per block: four times smaller than 16-bit, read faster from memory, a little less exact.",
  "avx512-vnni": "A set of CPU instructions that multiply many small integers at once; the engine uses it for its 4-bit matrix products.",
  cost: "What the request would be billed: its input tokens and output tokens, each times the model's price per million tokens.",
};

let tip = null;

function show(term) {
  tip ??= document.body.appendChild(el("div", { class: "glossary-tip", role: "tooltip", id: "glossary-tip" }));
  tip.textContent = `${term.dataset.term}: ${TERMS[term.dataset.term]}`;
  const box = term.getBoundingClientRect();
  tip.style.left = `${Math.max(8, Math.min(box.left, window.innerWidth - 328))}px`;
  tip.style.top = `${box.bottom + window.scrollY + 6}px`;
  tip.hidden = false;
  term.setAttribute("aria-describedby", "glossary-tip");
}

function hide() {
  if (tip) tip.hidden = true;
}

// Gives every <dfn data-term> under `root` its definition (a term the glossary does not know is a mistake: it says so).
export function defineTerms(root = document) {
  for (const term of root.querySelectorAll("dfn[data-term]:not([title])")) {
    const meaning = TERMS[term.dataset.term];
    if (!meaning) console.warn(`glossary: no definition for ${term.dataset.term}`);
    term.title = meaning ?? "";
    term.tabIndex = 0;
  }
}

document.addEventListener("click", (event) => {
  const term = event.target.closest?.("dfn[data-term]");
  if (term) show(term);
  else hide();
});
document.addEventListener("keydown", (event) => {
  const term = event.target.closest?.("dfn[data-term]");
  if (event.key === "Escape") hide();
  else if (term && event.key === "Enter") show(term);
});
