// Staff watch page: API requests from other clients, token by token.
import { el } from "./dom.js";
import { PipelineSocket } from "./socket.js";

const cards = new Map();

function card(id, title) {
  if (!cards.has(id)) {
    const node = el("article", { class: "stage active" });
    node.append(el("h3", {}, title), el("div", { class: "bubble assistant" }), el("p", { class: "muted" }, "streaming…"));
    document.getElementById("watch").prepend(node);
    cards.set(id, node);
  }
  return cards.get(id);
}

new PipelineSocket("/ws/watch/", {
  onFrame(frame) {
    if (frame.type === "request") card(frame.request_id, `${frame.request_id} · ${frame.source} · ${frame.model}`);
    if (frame.type !== "trace") return;
    const node = card(frame.request_id, frame.request_id);
    const event = frame.event;
    if (event.event === "text") node.querySelector(".bubble").append(document.createTextNode(event.text));
    if (event.event === "finished") {
      const t = event.timings;
      node.querySelector("p").textContent = `${event.finish_reason} · ${event.prompt_tokens} + ${event.completion_tokens} tokens · TTFT ${(t.ttft * 1000).toFixed(0)} ms`;
    }
  },
  onStatus(status) {
    const line = document.getElementById("socket-status");
    line.className = `status ${status}`;
    line.textContent = status === "reconnecting" ? "connection lost — reconnecting…" : status;
  },
});
