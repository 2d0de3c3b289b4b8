// Staff watch page: the requests of every client (API, pages, benchmark) as cards with their answers, and every stage
// of the picked one (the newest until another is picked), drawn by the chat page's own renderer from the frames the
// gateway publishes while someone watches (API requests are traced at summary level meanwhile).
import { el } from "./dom.js";
import { defineTerms } from "./glossary.js";
import { Player } from "./player.js";
import { drawRun } from "./render.js";
import { Run } from "./run.js";
import { PipelineSocket } from "./socket.js";

defineTerms(); // the stages' terms, as on the chat page
const watched = new Map(); // request id -> {run, card}
let newest = null;
let picked = null; // null: follow the newest

const player = new Player((run) => {
  const entry = watched.get(run.requestId);
  drawCard(entry);
  if (entry === shown()) drawRun(run);
});

function shown() {
  return watched.get(picked ?? newest) ?? null;
}

function entryFor(frame, at) {
  const id = frame.request_id;
  if (!watched.has(id)) {
    const { endpoint = "", api = endpoint, source = "", model = "", body = null } = frame;
    const run = new Run({ request_id: id, endpoint, api, source, model, body });
    run.requestId = id;
    run.sentAt = at; // the watch page's clock starts when it hears of the request
    const card = el("article", { class: "stage watch-card" });
    const open = el("button", { type: "button", class: "link" }, `${id} · ${source} · ${model}`);
    open.addEventListener("click", () => pick(id));
    const title = el("h3");
    title.append(open, " ", el("span", { class: "api-name" }, api.split(" · ")[0]));
    card.append(title, el("div", { class: "bubble assistant" }), el("p", { class: "muted" }, "streaming…"));
    document.getElementById("watch").prepend(card);
    watched.set(id, { run, card });
    newest = id;
    markPicked();
  }
  return watched.get(id);
}

function pick(id) {
  picked = id === newest ? null : id;
  markPicked();
  drawRun(shown().run);
}

function markPicked() {
  for (const { card } of watched.values()) card.classList.toggle("picked", card === shown()?.card);
}

function drawCard({ run, card }) {
  const bubble = card.querySelector(".bubble");
  if (bubble.textContent !== run.text) bubble.textContent = run.text;
  const f = run.finished;
  if (f) card.querySelector("p").textContent =
    `${f.finish_reason} · ${f.prompt_tokens} + ${f.completion_tokens} tokens · TTFT ${(f.timings.ttft * 1000).toFixed(0)} ms`;
  else if (run.error) card.querySelector("p").textContent = run.error.message;
}

new PipelineSocket("/ws/watch/", {
  onFrame(frame, at) {
    if (!frame.request_id) return; // hello, pong
    player.push(entryFor(frame, at).run, frame, at);
  },
  onStatus(status) {
    const line = document.getElementById("socket-status");
    line.className = `status ${status}`;
    line.textContent = status === "reconnecting" ? "connection lost — reconnecting…" : status;
  },
});
