// One message on screen. A question is plain text (what was typed, exactly); an answer is rendered Markdown with its
// exact tokens one click away, and how it ended and how fast it came under it. Each has its controls; what they do
// is the thread view's business (`data-action` on every button).
import { el, ms } from "./dom.js";
import { StreamingMarkdown } from "./markdown.js";
import { recall, remember } from "./prefs.js";
import { roving } from "./roving.js";

const action = (name, label, title = label) => el("button", { type: "button", class: "act", "data-action": name, title, "aria-label": title }, label);

// The version switcher ("‹ 2 / 3 ›") when a message has siblings of its role, then the buttons.
function controls(message, conversation, actions) {
  const bar = el("div", { class: "msg-bar" });
  const { all, index } = conversation.versions(message);
  if (all.length > 1) {
    const older = action("older", "‹", "previous version");
    const newer = action("newer", "›", "next version");
    older.disabled = index === 0;
    newer.disabled = index === all.length - 1;
    const versions = el("span", { class: "versions" });
    versions.append(older, el("span", { class: "version-n" }, `${index + 1} / ${all.length}`), newer);
    bar.append(versions);
  }
  for (const [name, label, title] of actions) bar.append(action(name, label, title));
  return bar;
}

export class QuestionView {
  constructor(text) {
    this.message = null;
    this.node = el("div", { class: "bubble user", role: "article", "aria-label": "your message" });
    this.node.append(el("div", { class: "text" }, text));
  }

  // The kept question: its id and controls.
  settle(message, conversation) {
    this.message = message;
    this.node.dataset.id = String(message.id);
    this.node.querySelector(".text").textContent = message.content;
    this.bar(conversation);
  }

  // The controls, again after the tree changed (the number of versions).
  bar(conversation) {
    this.node.querySelector(".msg-bar")?.remove();
    this.node.append(controls(this.message, conversation, [["edit", "Edit", "edit and send again (a new version)"], ["copy", "Copy"], ["delete", "Delete", "delete this question and its answer"]]));
  }

  // Edit in place: the text becomes a box with Send and Cancel; `send(text)` gets the new question.
  edit(send) {
    const text = this.node.querySelector(".text");
    const box = el("textarea", { class: "edit-box", rows: 3, "aria-label": "edit your message" });
    box.value = this.message.content;
    const form = el("form", { class: "edit-form" });
    const buttons = el("div", { class: "buttons" });
    buttons.append(el("button", { type: "submit" }, "Send"), el("button", { type: "button", "data-edit": "cancel" }, "Cancel"));
    form.append(box, buttons);
    const close = () => {
      form.replaceWith(text);
      this.node.classList.remove("editing");
    };
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (!box.value.trim()) return;
      close();
      send(box.value);
    });
    buttons.querySelector('[data-edit="cancel"]').addEventListener("click", close);
    this.node.classList.add("editing");
    text.replaceWith(form);
    box.focus();
  }
}

// How an answer ended, for people: nothing for a natural end.
const ENDINGS = { length: "stopped: length", stopped: "stopped", error: "failed" };

export class AnswerView {
  // run: the live run writing this answer (null for a kept answer from an earlier visit); prefix: the text it goes
  // on from (a continuation or a branch).
  constructor({ run = null, prefix = "" } = {}) {
    this.run = run;
    this.prefix = prefix;
    this.message = null;
    this.node = el("div", { class: "bubble assistant live", role: "article", "aria-label": "answer" });
    this.rendered = el("div", { class: "answer" });
    this.tokens = null; // the exact-tokens view, built when first shown
    this.node.append(this.rendered);
    this.markdown = new StreamingMarkdown(this.rendered);
    this.mode = recall("answer-view", "rendered");
    this.shownTokens = 0;
    this.show(this.mode);
  }

  get text() {
    return this.message ? this.message.content : this.prefix + (this.run?.text ?? "");
  }

  // Called on animation frames while the run streams: only the view that is shown is brought up to date.
  draw() {
    if (this.mode === "tokens") this.drawTokens();
    else this.markdown.update(this.text);
  }

  show(mode) {
    this.mode = mode;
    if (mode === "tokens" && !this.tokens) {
      this.tokens = el("div", { class: "text tokens-view", "data-rove": ".tok" });
      if (this.prefix) this.tokens.append(el("span", { class: "branch-prefix", title: "the text this answer went on from" }, this.prefix));
      this.node.insertBefore(this.tokens, this.rendered.nextSibling);
    }
    this.rendered.hidden = mode === "tokens";
    if (this.tokens) this.tokens.hidden = mode !== "tokens";
    this.draw();
    if (mode === "tokens" && this.message) roving(this.tokens);
    const toggle = this.node.querySelector('[data-action="view"]');
    if (toggle) toggle.textContent = mode === "tokens" ? "Rendered" : "Tokens";
  }

  toggle() {
    this.show(this.mode === "tokens" ? "rendered" : "tokens");
    remember("answer-view", this.mode);
  }

  // The answer's tokens, each a button to its full trace; an answer kept from an earlier visit has no trace, only
  // its exact text.
  drawTokens() {
    const run = this.run;
    if (!run) {
      if (!this.tokens.childElementCount) this.tokens.append(el("span", { class: "raw-text" }, this.text));
      return;
    }
    for (let n = this.shownTokens + 1; n <= run.lastStep; n++) {
      const step = run.steps.get(n);
      if (step?.sampled?.is_stop) break; // the end-of-turn token has no text
      if (!step?.text && !(run.finished && step?.sampled)) break;
      this.tokens.append(el("span", { class: "tok", "data-step": String(n), title: `token ${n}` }, step.text ? step.text.text : ""));
      this.shownTokens = n;
    }
  }

  // The answer is over: `message` is what was kept (null when the turn failed, or for a replay); `last`: it ends the
  // shown thread (only then can it be continued).
  settle(message, conversation, last) {
    this.message = message;
    this.node.classList.remove("live");
    if (message) this.node.dataset.id = String(message.id);
    this.markdown.update(this.text);
    this.markdown.finish();
    if (this.mode === "tokens") {
      this.drawTokens();
      roving(this.tokens);
    }
    this.node.classList.toggle("empty", !this.text);
    if (message) this.bar(conversation, last);
  }

  // The controls and the ending line, again after the tree changed (versions; Continue only at the thread's end).
  bar(conversation, last) {
    const message = this.message;
    this.node.querySelector(".msg-bar")?.remove();
    const bar = controls(message, conversation, [
      ["copy", "Copy"],
      ["regenerate", "Regenerate", "a new answer to the same question (this one stays as a version)"],
      ["view", this.mode === "tokens" ? "Rendered" : "Tokens", "switch between the rendered answer and its exact tokens"],
      ["delete", "Delete", "delete this answer and its question"],
    ]);
    bar.append(ending(message, last));
    this.node.append(bar);
  }
}

// "TTFT 72 ms · 141.3 tokens/s · 64 tokens", then how it ended (with Continue after a cut).
function ending(message, last) {
  const line = el("span", { class: "msg-end" });
  const stats = [];
  if (message.ttft_ms !== null) stats.push(`TTFT ${ms(message.ttft_ms)}`);
  if (message.tokens_per_s) stats.push(`${message.tokens_per_s.toFixed(1)} tokens/s`);
  stats.push(`${message.completion_tokens} token${message.completion_tokens === 1 ? "" : "s"}`);
  line.append(el("span", { class: "stats" }, stats.join(" · ")));
  const said = ENDINGS[message.finish_reason];
  if (said) {
    const finish = el("span", { class: `finish ${message.finish_reason}` }, said);
    if (message.finish_reason === "length" && last) finish.append(" — ", action("continue", "Continue", "let the model go on from where it was cut"));
    line.append(finish);
  }
  return line;
}

// A kept answer from an earlier visit, rendered whole.
export function keptAnswer(message, conversation, last) {
  const view = new AnswerView();
  view.settle(message, conversation, last);
  return view;
}
