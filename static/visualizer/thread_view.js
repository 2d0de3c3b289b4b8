// The shown thread of a conversation as bubbles. Bubbles are kept per message and reused when the thread is shown
// again (another version picked, a turn deleted, an answer kept), so nothing is rendered twice; live bubbles are
// appended at the end while a turn runs. Clicks on the controls go to `actions[name](message, view)`.
import { AnswerView, keptAnswer, QuestionView } from "./bubbles.js";

export class ThreadView {
  constructor(host, actions) {
    this.host = host;
    this.views = new Map(); // message id -> its QuestionView or AnswerView
    this.answers = new WeakMap(); // bubble node -> its AnswerView, live ones too
    host.addEventListener("click", (event) => {
      const button = event.target.closest("[data-action]");
      const bubble = button?.closest(".bubble");
      if (!button || !bubble || button.disabled) return;
      const view = this.views.get(Number(bubble.dataset.id));
      if (view?.message) actions[button.dataset.action]?.(view.message, view);
    });
  }

  // The bubbles of `path` (messages, oldest first) and nothing else.
  show(conversation, path) {
    const last = path[path.length - 1];
    const nodes = path.map((message) => {
      let view = this.views.get(message.id);
      if (view) {
        view.bar(conversation, message === last); // versions and Continue depend on the rest of the tree
      } else if (message.role === "user") {
        view = new QuestionView(message.content);
        view.settle(message, conversation);
      } else {
        view = keptAnswer(message, conversation, message === last);
        this.answers.set(view.node, view);
      }
      this.views.set(message.id, view);
      return view.node;
    });
    this.host.replaceChildren(...nodes);
  }

  // A question not kept yet (its turn is running).
  addQuestion(text) {
    const view = new QuestionView(text);
    this.host.append(view.node);
    return view;
  }

  addAnswer(options) {
    const view = new AnswerView(options);
    this.answers.set(view.node, view);
    this.host.append(view.node);
    view.node.scrollIntoView({ block: "end" });
    return view;
  }

  // A live view whose message is now kept: it is that message's bubble from now on.
  adopt(view, message) {
    this.views.set(message.id, view);
  }

  // The answer view `node` is part of (a token, a button), live or kept.
  answerOf(node) {
    return this.answers.get(node.closest(".bubble.assistant")) ?? null;
  }

  forget() {
    this.views.clear();
    this.host.replaceChildren();
  }
}
