// The conversation's turns: ask, regenerate, edit and send again, continue, branch from a token, delete a turn, pick a
// version. Each turn is one run on the socket (`start(messages, placement)` sends it), whose chat frame says where
// the server keeps the answer; the "done" frame says what it kept, and the page shows exactly that.
import { conversations } from "./conversations.js";
import { recall, remember } from "./prefs.js";
import { Conversation } from "./thread.js";
import { ThreadView } from "./thread_view.js";

export class Chat {
  // start(messages, extra): sends a run (extra: chat frame fields), returns it or null; system(): the system prompt
  // in the settings; copy(text, button); restore(text): put a question that was not sent back in the message box;
  // changed(conversation): the open conversation or its title changed; failed(message): say what went wrong.
  constructor(host, { start, system, copy, restore, changed, failed }) {
    Object.assign(this, { start, system, restore, changed, failed });
    this.conversation = new Conversation();
    this.runs = new Map(); // kept answer id -> the run that wrote it (its tokens and trace), this visit only
    this.live = null; // {run, question, answer, text}: the turn on screen now
    this.view = new ThreadView(host, {
      copy: (message, view) => copy(message.content, view.node.querySelector('[data-action="copy"]')),
      regenerate: (message) => this.regenerate(message),
      edit: (message, view) => this.idle() && view.edit((text) => this.edit(message, text)),
      continue: (message) => this.continue(message),
      view: (message, view) => view.toggle(),
      delete: (message) => this.deleteTurn(message),
      older: (message) => this.pick(message, -1),
      newer: (message) => this.pick(message, 1),
    });
  }

  idle() {
    return !this.live || this.live.run.done;
  }

  base(extra) {
    return { conversation: this.conversation.id, ...extra };
  }

  // A new question after the shown thread.
  ask(text) {
    if (!this.idle()) return null;
    const last = this.conversation.current;
    const run = this.start([...this.conversation.history(last, this.system()), { role: "user", content: text }], this.base({ parent: last }));
    if (run) this.live = { run, text, question: this.view.addQuestion(text), answer: this.view.addAnswer({ run }) };
    return run;
  }

  // Another answer to the same question; the earlier one stays as a version.
  regenerate(answer) {
    if (!this.idle()) return;
    const question = this.conversation.messages.get(answer.parent);
    if (!question) return;
    const run = this.start(this.conversation.history(question.id, this.system()), this.base({ answer_to: question.id }));
    if (!run) return;
    this.view.show(this.conversation, this.conversation.pathTo(question.id));
    this.live = { run, answer: this.view.addAnswer({ run }) };
  }

  // The question edited: a new version of it, answered; the conversation branches there.
  edit(question, text) {
    if (!this.idle()) return;
    const run = this.start([...this.conversation.history(question.parent, this.system()), { role: "user", content: text }], this.base({ parent: question.parent }));
    if (!run) return;
    this.view.show(this.conversation, this.conversation.pathTo(question.parent));
    this.live = { run, text, question: this.view.addQuestion(text), answer: this.view.addAnswer({ run }) };
  }

  // An answer cut by max_tokens goes on from where it stopped, in the same bubble.
  continue(answer) {
    if (!this.idle()) return;
    const run = this.start(this.conversation.history(answer.id, this.system()), this.base({ continue_final_message: true, extend: answer.id }));
    if (!run) return;
    this.view.show(this.conversation, this.conversation.pathTo(answer.parent));
    this.live = { run, answer: this.view.addAnswer({ run, prefix: answer.content }) };
  }

  // From a re-drawn token: the answer up to it (`answered`: this run's part of it, which may itself have gone on from
  // an earlier text), then the model goes on; a new version of that answer. A run whose
  // answer was not kept (a replay) branches as a new exchange after the shown thread.
  branch(run, answered) {
    if (!this.idle()) return;
    const text = (run.request.continue_final_message ? run.request.messages.at(-1).content : "") + answered;
    const kept = [...this.runs].find(([, r]) => r === run)?.[0];
    const answer = kept === undefined ? null : this.conversation.messages.get(kept);
    const prefix = { role: "assistant", content: text };
    if (answer) {
      const next = this.start([...this.conversation.history(answer.parent, this.system()), prefix], this.base({ continue_final_message: true, answer_to: answer.parent }));
      if (!next) return;
      this.view.show(this.conversation, this.conversation.pathTo(answer.parent));
      this.live = { run: next, answer: this.view.addAnswer({ run: next, prefix: text }) };
      return;
    }
    const asked = run.request.messages.findLast((m) => m.role === "user").content;
    const last = this.conversation.current;
    const history = [...this.conversation.history(last, this.system()), { role: "user", content: asked }, prefix];
    const next = this.start(history, this.base({ continue_final_message: true, parent: last }));
    if (next) this.live = { run: next, text: asked, question: this.view.addQuestion(asked), answer: this.view.addAnswer({ run: next, prefix: text }) };
  }

  // Called on animation frames: the live answer catches up with its run.
  draw(run) {
    if (this.live?.run === run) this.live.answer.draw();
  }

  // The turn's "done" frame (or its end without one: an error, a dropped socket). What the server kept becomes the
  // conversation's; a turn that kept nothing leaves the thread as it was and its question back in the message box.
  done(run, frame) {
    const live = this.live;
    if (!live || live.run !== run) return;
    if (!frame?.answer) {
      live.question?.node.remove();
      live.answer.node.remove();
      this.view.show(this.conversation, this.conversation.path());
      if (live.text !== undefined && !run.replay) this.restore(live.text);
      return;
    }
    if (frame.conversation !== this.conversation.id) this.conversation = new Conversation({ id: frame.conversation, current: null });
    if (frame.question) this.conversation.add(frame.question);
    this.conversation.add(frame.answer);
    this.conversation.current = frame.current;
    this.runs.set(frame.answer.id, run);
    if (live.question && frame.question) this.view.adopt(live.question, frame.question);
    this.view.adopt(live.answer, frame.answer);
    live.question?.settle(frame.question, this.conversation);
    live.answer.settle(frame.answer, this.conversation, true);
    this.view.show(this.conversation, this.conversation.path());
    remember("conversation", this.conversation.id);
    this.changed(this.conversation);
  }

  // The socket dropped mid-turn: what was written stays on screen (the server keeps it too, as stopped; reopening the
  // conversation shows it as kept).
  dropped(run) {
    if (this.live?.run !== run) return;
    this.live.answer.settle(null, this.conversation, false);
    this.live.answer.node.classList.add("dropped");
  }

  // A replayed recording: shown like a turn, kept nowhere.
  replayed(run) {
    const asked = run.request.messages.findLast((m) => m.role === "user")?.content ?? "";
    this.view.addQuestion(`(replay) ${asked}`);
    this.live = { run, answer: this.view.addAnswer({ run }) };
  }

  settleReplay(run) {
    if (this.live?.run === run && run.replay) this.live.answer.settle(null, this.conversation, false);
  }

  async deleteTurn(message) {
    if (!this.idle()) return;
    await this.apply(() => conversations.deleteTurn(this.conversation.id, message.id));
  }

  // The previous or next version of `message`: the thread runs through it from then on.
  async pick(message, step) {
    if (!this.idle()) return;
    const { all, index } = this.conversation.versions(message);
    const other = all[index + step];
    if (other) await this.apply(() => conversations.show(this.conversation.id, other.id));
  }

  // A change made on the server; the conversation as it now stands is shown.
  async apply(change) {
    try {
      const data = await change();
      if (data) this.open(data);
      else this.clear();
    } catch (error) {
      this.failed(`That did not work: ${error.message}.`);
    }
  }

  async load(id) {
    const data = await conversations.load(id).catch(() => null);
    if (data) this.open(data);
    else if (id === Number(recall("conversation"))) remember("conversation", null); // gone: do not try again
    return Boolean(data);
  }

  open(data) {
    if (data.id !== this.conversation.id) this.view.forget();
    this.conversation = new Conversation(data);
    this.view.show(this.conversation, this.conversation.path());
    remember("conversation", data.id);
    this.changed(this.conversation);
  }

  clear() {
    this.conversation = new Conversation();
    this.view.forget();
    remember("conversation", null);
    this.changed(this.conversation);
  }
}
