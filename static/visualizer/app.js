// The chat page: composes requests, talks to the pipeline socket, keeps conversations, records and replays runs.
import { el } from "./dom.js";
import { Player } from "./player.js";
import { drawRun, inspectionView, tokenDetail } from "./render.js";
import { roving } from "./roving.js";
import { Run } from "./run.js";
import { PipelineSocket } from "./socket.js";
import { Tour } from "./tour.js";
import { showResampled, whatIfPanel } from "./what_if.js";

const $ = (id) => document.getElementById(id);
const state = { run: null, lastRun: null, imported: null, conversation: null, history: [], bubble: null };

const tour = new Tour($("tour"));
document.addEventListener("roundtrip:ask", (event) => { // a view asks the worker something about the shown run
  state.asking = true;
  socket.send(event.detail);
});
const player = new Player((run) => {
  drawRun(run);
  drawBubble(run);
  finishIfDone(run);
  tour.update(run);
});

const socket = new PipelineSocket("/ws/pipeline/", {
  onFrame(frame, at) {
    if (frame.type === "hello" || frame.type === "pong") return;
    if (frame.type === "inspection" || (frame.type === "error" && state.inspecting)) {
      showInspection(frame);
      return;
    }
    if (frame.type === "prompt_attention" || (frame.type === "error" && state.asking)) {
      state.asking = false;
      document.dispatchEvent(new CustomEvent("roundtrip:prompt-attention", { detail: frame }));
      return;
    }
    if (frame.type === "resampled" || (frame.type === "error" && state.resampling)) {
      state.resampling = false;
      showResampled(frame);
      return;
    }
    if (!state.run) {
      if (frame.type === "error") showError(frame.message);
      return;
    }
    player.push(state.run, frame, at);
    keepGoing(state.run, frame);
  },
  onStatus(status) {
    const line = $("socket-status");
    line.className = `status ${status}`;
    line.textContent = { connected: "connected", reconnected: "reconnected", reconnecting: "connection lost — reconnecting…" }[status];
    if (status === "reconnected") watchModelLoading(); // a restarted server loads its model again
    if (status === "reconnecting" && state.run && !state.run.done) {
      state.run.done = true;
      showError("The connection dropped during this answer; it was stopped. Send again when reconnected.");
      setBusy(false);
    }
  },
});

function speed() {
  return document.querySelector('input[name="speed"]:checked').value;
}

function params() {
  const out = {};
  for (const name of ["temperature", "top_p", "top_k", "max_tokens", "seed"]) {
    const raw = $(name).value.trim();
    if (raw !== "") out[name] = Number(raw);
  }
  if ($("response_format").value !== "text") out.response_format = { type: $("response_format").value };
  const bias = $("logit_bias").value.trim();
  if (bias) {
    try {
      out.logit_bias = JSON.parse(bias); // the server checks it and says what is wrong
    } catch {
      out.logit_bias = bias;
    }
  }
  return out;
}

function showError(message) {
  const box = $("chat-error");
  box.textContent = message;
  box.hidden = !message;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("cancel").disabled = !busy;
  $("next").disabled = !(busy && speed() === "step");
}

function addBubble(role, text) {
  const bubble = el("div", { class: `bubble ${role}` });
  bubble.append(el("span", { class: "role" }, role === "user" ? "you" : "assistant"), el("div", { class: "text" }, text));
  $("bubbles").append(bubble);
  bubble.scrollIntoView({ block: "end" });
  return bubble;
}

// The answer as clickable tokens: each opens its full trace (Enter too; arrow keys walk them).
function drawBubble(run) {
  if (!state.bubble || state.bubble.run !== run) return;
  const text = state.bubble.node.querySelector(".text");
  appendTokens(run, text);
  text.dataset.rove = ".tok";
  roving(text);
}

function appendTokens(run, text) {
  for (let n = text.childElementCount + 1; n <= run.lastStep; n++) {
    const step = run.steps.get(n);
    if (step?.sampled?.is_stop) return; // the end-of-turn token has no text
    if (!step?.text && !(run.finished && step?.sampled)) return;
    const piece = step.text ? step.text.text : "";
    text.append(el("span", { class: "tok", "data-step": String(n), title: `token ${n}` }, piece));
  }
  if (run.finished && run.finished.text !== run.text) text.append(el("span", {}, run.finished.text.slice(run.text.length)));
}

function finishIfDone(run) {
  if (!run.done || run.finishedHandled) return;
  run.finishedHandled = true;
  setBusy(false);
  $("export-run").disabled = false;
  $("replay-tour").disabled = false;
  state.lastRun = run;
  if (run.error) showError(`${run.error.message}`);
  if (run.finished && run === state.run) {
    const continued = run.request.continue_final_message; // a branch: its question, and the answer as it now reads
    const question = run.request.messages.at(continued ? -2 : -1).content;
    state.history.push({ role: "user", content: question }, { role: "assistant", content: (continued ? run.request.messages.at(-1).content : "") + run.finished.text });
    const done = run.frames.find(({ frame }) => frame.type === "done");
    if (done?.frame.conversation) state.conversation = done.frame.conversation;
    htmx.trigger(document.body, "conversation-saved");
  }
}

// A run the guided tour let go after its first token runs on in step mode: the page asks for each next token itself.
function keepGoing(run, frame) {
  if (state.released === run && frame.type === "trace" && frame.event.event === "text" && !run.lastSampled?.is_stop) socket.send({ type: "next" });
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});

// Sends the composed message as a new run (null when there is nothing to send or a run is still going).
function send() {
  const prompt = $("prompt").value;
  if (!prompt.trim() || (state.run && !state.run.done)) return null;
  const system = $("system").value.trim();
  const messages = [...(system ? [{ role: "system", content: system }] : []), ...state.history, { role: "user", content: prompt }];
  const run = startRun(messages, {});
  if (!run) return null;
  addBubble("user", prompt);
  state.bubble = { run, node: addBubble("assistant", "") };
  $("prompt").value = "";
  return run;
}

// A branch from a re-drawn token: the same question, the answer up to that token, and the model going on from there.
// It takes the place of the answer it branched from in the history that later turns send.
function branch(run, answerSoFar) {
  if (state.run && !state.run.done) return;
  const continued = run.request.continue_final_message; // branching from a branch: its own prefix comes first
  const base = continued ? run.request.messages.slice(0, -1) : run.request.messages;
  const text = (continued ? run.request.messages.at(-1).content : "") + answerSoFar;
  const question = base.at(-1).content;
  if (state.history.at(-2)?.content === question) state.history.splice(-2, 2);
  const next = startRun([...base, { role: "assistant", content: text }], { continue_final_message: true });
  if (!next) return;
  $("token-dialog").close();
  addBubble("user", `${question}  ↳ branch from “${text}”`);
  state.bubble = { run: next, node: addBubble("assistant", "") };
  state.bubble.node.querySelector(".text").before(el("span", { class: "branch-prefix" }, text));
}

function startRun(messages, extra) {
  showError("");
  const request = {
    type: "chat",
    model: $("model").value,
    messages,
    params: params(),
    level: $("level").value,
    step: speed() === "step",
    conversation: state.conversation,
    ...extra,
  };
  player.speed = speed() === "slow" ? "slow" : "live";
  const run = new Run(request);
  run.sentAt = performance.now();
  if (!socket.send(request)) {
    showError("Not connected to the server yet; try again in a moment.");
    return null;
  }
  state.run = run;
  setBusy(true);
  drawRun(run);
  return run;
}

// The guided tour on a live run: the walkthrough's question unless one is typed, at full detail, in step mode, so
// the engine waits after the first token while the tour walks the stages.
$("tour-start").addEventListener("click", (event) => {
  if (state.run && !state.run.done) return;
  tour.end();
  if (!$("prompt").value.trim()) $("prompt").value = event.currentTarget.dataset.question;
  $("level").value = "full";
  document.querySelector('input[name="speed"][value="step"]').checked = true;
  const run = send();
  if (!run) return;
  tour.start(run, () => {
    state.released = run;
    socket.send({ type: "next" });
  });
});

$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("next").addEventListener("click", () => socket.send({ type: "next" }));
$("cancel").addEventListener("click", () => socket.send({ type: "cancel" }));
document.querySelectorAll('input[name="speed"]').forEach((r) => r.addEventListener("change", () => setBusy(state.run && !state.run.done)));

$("bubbles").addEventListener("click", (event) => {
  const token = event.target.closest(".tok");
  const run = state.bubble?.run ?? state.lastRun;
  if (!token || !run) return;
  const step = Number(token.dataset.step);
  const more = el("button", { type: "button", id: "inspect-token" }, "Recompute the full detail for this token");
  more.addEventListener("click", () => inspectToken(run, step, more));
  const whatIf = run.tokenized ? whatIfPanel(run, step, (frame) => { state.resampling = true; socket.send(frame); }, (text) => branch(run, text)) : "";
  $("token-detail").replaceChildren(tokenDetail(run, step), whatIf, more, el("div", { id: "inspection" }));
  $("token-dialog").showModal();
});

// The page asks for more on demand: the worker recomputes the pass that produced token `step`
// (the prompt plus the tokens before it) with full detail, attention over up to 2048 positions.
function inspectToken(run, step, button) {
  if (!run.tokenized) return;
  const before = [];
  for (let n = 1; n < step; n++) before.push(run.steps.get(n).sampled.token_id);
  state.inspecting = run; // the run whose token is recomputed: it labels the positions of the answer
  button.disabled = true;
  button.textContent = "Recomputing…";
  socket.send({ type: "inspect", model: run.request.model, ids: [...run.tokenized.ids, ...before], step });
}

function showInspection(frame) {
  const run = state.inspecting;
  state.inspecting = null;
  const box = document.getElementById("inspection");
  const button = document.getElementById("inspect-token");
  if (!box) return;
  if (button) button.hidden = true;
  if (frame.type === "error") {
    box.replaceChildren(el("p", { class: "error" }, frame.message));
    return;
  }
  box.replaceChildren(inspectionView(frame.detail, run));
}

$("new-conversation").addEventListener("click", () => {
  state.conversation = null;
  state.history = [];
  $("bubbles").replaceChildren();
  showError("");
});

// A conversation picked in the list (an htmx partial) brings its history back in.
document.body.addEventListener("htmx:afterSwap", (event) => {
  if (event.detail.target?.id !== "history-loader") return;
  const history = JSON.parse(document.getElementById("loaded-history").textContent);
  const meta = document.getElementById("loaded-conversation");
  state.conversation = Number(meta.dataset.id);
  state.history = history;
  $("system").value = meta.dataset.system;
  $("bubbles").replaceChildren();
  for (const m of history) addBubble(m.role, m.content);
});

$("export-run").addEventListener("click", () => {
  const run = state.lastRun;
  if (!run) return;
  const blob = new Blob([JSON.stringify(run.toJSON(), null, 1)], { type: "application/json" });
  const link = el("a", { href: URL.createObjectURL(blob), download: `roundtrip-run-${Date.now()}.json` });
  document.body.append(link);
  link.click();
  link.remove();
});

$("import-run").addEventListener("change", async (event) => {
  const file = event.target.files[0];
  if (!file) return;
  try {
    const data = JSON.parse(await file.text());
    if (data.format !== "roundtrip-run" || !Array.isArray(data.frames)) throw new Error("not a Roundtrip run");
    state.imported = data;
    $("replay-run").disabled = false;
    $("replay-tour").disabled = false;
    showError("");
  } catch (error) {
    showError(`Could not import ${file.name}: ${error.message}.`);
  }
});

$("replay-run").addEventListener("click", () => replay(false));
// The same tour over a recording, without the model: the replay holds after the first token as the engine would.
$("replay-tour").addEventListener("click", () => {
  tour.end();
  const run = replay(true);
  if (run) tour.start(run, run.release);
});

// Plays the imported recording (else this page's last run) into a new run; `hold`: stop after its first token until
// run.release() is called.
function replay(hold) {
  const recorded = state.imported ?? state.lastRun?.toJSON();
  if (!recorded || (state.run && !state.run.done)) return null;
  const run = new Run(recorded.request);
  run.replay = true;
  state.run = run;
  addBubble("user", `(replay) ${recorded.request.messages.at(-1).content}`);
  state.bubble = { run, node: addBubble("assistant", "") };
  player.speed = speed() === "slow" ? "slow" : "live";
  run.release = player.replay(run, recorded, hold);
  return run;
}

// While the worker loads the model, say so, with its progress (from /health); requests sent meanwhile wait for it.
async function watchModelLoading() {
  if (state.watchingLoad) return;
  state.watchingLoad = true;
  try {
    await pollHealth($("model-loading"));
  } finally {
    state.watchingLoad = false;
  }
}

async function pollHealth(box) {
  for (;;) {
    let health;
    try {
      health = await (await fetch("/health")).json();
    } catch {
      health = null;
    }
    if (health?.ready) {
      box.hidden = true;
      return;
    }
    const model = health ? Object.entries(health.models).find(([, s]) => s.state !== "ready") : null;
    // An unreachable server is the socket status line's news (it says "reconnecting"); this box only appears for a
    // server that answers but is still loading, and says so if that server then stops answering.
    if (health) box.hidden = false;
    else box.querySelector('[data-field="text"]').textContent = "Waiting for the server to answer…";
    if (model) {
      const [id, s] = model;
      box.querySelector('[data-field="text"]').textContent =
        s.state === "failed" ? `The model ${id} could not be loaded: ${s.detail}` : `Loading ${id}: ${s.stage ?? "starting"} ${s.done ?? 0}/${s.total ?? "?"} ${s.detail ?? ""}`;
      const bar = box.querySelector('[data-field="bar"]');
      bar.max = s.total || 1;
      bar.value = s.done || 0;
      if (s.state === "failed") return;
    }
    await new Promise((resolve) => setTimeout(resolve, 400));
  }
}
watchModelLoading();
