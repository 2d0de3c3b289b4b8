// "What if": one step of a finished answer drawn again with other sampling settings. The worker recomputes that
// step's real logits from the tokens before it and runs them through the sampler with the new settings; the panel
// shows the distribution each setting leaves and the token drawn, beside the one the answer actually got.
import { el, visible } from "./dom.js";

const SETTINGS = [
  ["temperature", "temperature", "0.05", 0, 2],
  ["top_k", "top-k (0: off)", "1", 0, 1000],
  ["top_p", "top-p", "0.01", 0.01, 1],
  ["min_p", "min-p", "0.01", 0, 1],
  ["frequency_penalty", "frequency penalty", "0.1", -2, 2],
  ["presence_penalty", "presence penalty", "0.1", -2, 2],
  ["seed", "seed", "1", 0, 2 ** 31],
];
const DEFAULTS = { temperature: 1, top_k: 0, top_p: 1, min_p: 0, frequency_penalty: 0, presence_penalty: 0, seed: 0 };

// The form for token `stepNumber` of `run`; `send` posts a socket frame, `branch(text)` continues the answer from
// `text` (the answer before that step and the token drawn) as a new turn. The answer goes to `showResampled`.
export function whatIfPanel(run, stepNumber, send, branch) {
  const given = run.request.params ?? {};
  const form = el("form", { class: "what-if", id: "what-if", noValidate: true }); // the server names a value out of range
  form.append(el("h4", {}, "What if this step had been sampled otherwise?"));
  const inputs = {};
  for (const [name, label, step, min, max] of SETTINGS) {
    const input = el("input", { type: "number", name, step, min, max, value: String(given[name] ?? DEFAULTS[name]) });
    inputs[name] = input;
    form.append(el("label", {}, `${label} `), input);
  }
  const go = el("button", { type: "submit" }, "Draw this step again");
  form.append(go, el("div", { class: "what-if-result", "data-field": "what-if-result", role: "status" }));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const before = [];
    for (let n = 1; n < stepNumber; n++) before.push(run.steps.get(n).sampled.token_id);
    const frame = { type: "resample", model: run.request.model, prompt_ids: run.tokenized.ids, generated: before, step: stepNumber };
    for (const [name, input] of Object.entries(inputs)) {
      if (input.value.trim() !== "") frame[name] = Number(input.value);
    }
    go.disabled = true;
    send(frame);
  });
  form.dataset.original = String(run.steps.get(stepNumber).sampled.token_id);
  form.answerBefore = Array.from({ length: stepNumber - 1 }, (_, i) => run.steps.get(i + 1).text?.text ?? "").join("");
  form.branch = branch;
  return form;
}

// The worker's answer ("resampled" or "error") into the open panel.
export function showResampled(frame) {
  const form = document.getElementById("what-if");
  if (!form) return;
  form.querySelector('button[type="submit"]').disabled = false;
  const out = form.querySelector('[data-field="what-if-result"]');
  if (frame.type === "error") {
    out.replaceChildren(el("p", { class: "error" }, frame.message));
    return;
  }
  const event = frame.event;
  const same = String(event.token_id) === form.dataset.original;
  const table = el("table", { class: "numbers" });
  table.append(el("caption", {}, "the step's real logits under these settings"));
  const head = el("tr");
  for (const title of ["token", "model's own", "after penalties and temperature", "chance to be drawn"]) head.append(el("th", {}, title));
  table.append(head);
  for (const c of event.detail?.candidates ?? []) {
    const row = el("tr", { class: c.token_id === event.token_id ? "picked" : "" });
    row.append(el("td", {}, visible(c.token)), el("td", {}, pct(c.raw_prob)), el("td", {}, pct(c.adjusted_prob)),
      el("td", {}, c.removed_by ? `cut by ${c.removed_by}` : pct(c.final_prob)));
    table.append(row);
  }
  const draw = event.detail?.draw == null ? "the likeliest token (greedy)" : `draw ${event.detail.draw.toFixed(4)}`;
  const go = el("button", { type: "button", "data-field": "branch" }, "Continue the answer from this token (a branch)");
  go.addEventListener("click", () => form.branch(form.answerBefore + event.token));
  out.replaceChildren(
    el("p", { "data-field": "what-if-token" }, `Drawn: ${visible(event.token)} (id ${event.token_id}), ${draw}; ` +
      `${kept(event.detail?.kept)} left after the filters. ${same ? "The same token as the answer got." : "A different token from the answer's: the rest of the answer would have gone another way."}`),
    table,
    go,
  );
}

function kept(count) {
  return count === undefined ? "some tokens" : `${count} token${count === 1 ? "" : "s"}`;
}

function pct(p) {
  return `${(p * 100).toFixed(2)}%`;
}
