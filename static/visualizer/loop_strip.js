// The autoregressive loop drawn: one row per generated token, "input so far → predicted token" with its
// probability and the KV cache beside it, growing as the answer does and ending on the end-of-sequence token
// (or on the max_tokens cut). Built from the run's sampled and forward events, so a replay draws it too.
import { el, visible } from "./dom.js";
import { roving } from "./roving.js";

export class LoopStrip {
  constructor(host) {
    this.list = el("ol", { class: "loop-strip", "data-rove": "li" });
    this.end = el("p", { class: "muted" });
    host.append(this.list, this.end);
    this.rows = 0;
    this.answer = ""; // the generated tokens so far, whitespace made visible
  }

  update(run) {
    const prompt = run.tokenized?.ids.length ?? run.finished?.prompt_tokens; // an upstream without a tokenizer: its usage
    if (!prompt) return;
    const room = prompt + (run.context?.max_tokens ?? 0);
    const rows = [];
    for (let n = this.rows + 1; n <= run.lastStep; n++) {
      const step = run.steps.get(n);
      if (!step?.sampled) break;
      rows.push(this.row(n, step, prompt, room));
      this.answer += visible(step.sampled.token);
      this.rows = n;
    }
    if (rows.length) {
      this.list.append(...rows);
      roving(this.list);
    }
    if (run.finished?.finish_reason === "length") this.end.textContent = `stopped after ${run.finished.completion_tokens} tokens: max_tokens reached before an end-of-sequence token`;
  }

  // Marks the row of the token the page's cursor is on, scrolled into the strip's view; a click on a row moves it.
  mark(step, move, scroll) {
    this.list.onclick ??= (event) => {
      const row = event.target.closest("li[data-step]");
      if (row) move(Number(row.dataset.step));
    };
    const row = this.list.querySelector(`li[data-step="${step}"]`);
    if (!row || row.classList.contains("cursor")) return;
    this.list.querySelector("li.cursor")?.classList.remove("cursor");
    row.classList.add("cursor");
    if (!scroll) return; // following a streaming answer: no layout read per token
    const top = row.offsetTop - this.list.offsetTop;
    if (top < this.list.scrollTop || top > this.list.scrollTop + this.list.clientHeight - row.offsetHeight) this.list.scrollTop = top;
  }

  row(n, step, prompt, room) {
    const s = step.sampled;
    const input = el("span", { class: "loop-in", title: `[${prompt} prompt tokens]${this.answer ? ` + ${this.answer}` : ""}` });
    // the answer so far is clipped on its left, so the tokens just fed back stay in view
    const answer = el("span", { class: "loop-answer" });
    answer.append(el("span", {}, this.answer));
    input.append(el("span", { class: "loop-prompt" }, `[${prompt} prompt tokens]${this.answer ? " + " : ""}`), answer);
    const p = `${(Math.exp(s.logprob) * 100).toFixed(1)}%`;
    const kv = step.forward?.kv_length;
    const li = el("li", { class: s.is_stop ? "eos" : "", "data-step": String(n) });
    li.append(
      el("span", { class: "loop-n" }, `step ${n}`),
      input,
      el("span", { class: "loop-arrow", title: "predicts" }, "→"),
      el("span", { class: "loop-out" }, s.is_stop ? `${s.token} (end of sequence)` : visible(s.token)),
      el("span", { class: "loop-p", title: "the model's probability for this token" }, p),
    );
    if (kv !== undefined) {
      const bar = el("span", { class: "loop-kv", title: `${kv} positions in the KV cache after this step's forward pass` });
      bar.append(el("i", { style: `width:${Math.min(100, (kv / Math.max(room, kv)) * 100)}%` }));
      li.append(bar, el("span", { class: "loop-kv-n" }, `KV ${kv}`));
    }
    return li;
  }
}
