// The chat page: wires the socket, the turns (chat.js), the pipeline (render.js, drawn only where it is seen), its
// strip, the conversation list, the guided tour and record & replay.
import { Chat } from "./chat.js";
import { ConversationList } from "./conversations.js";
import { el } from "./dom.js";
import { defineTerms } from "./glossary.js";
import { Layout } from "./layout.js";
import { ModelCard } from "./model_card.js";
import { copyCodeButtons } from "./markdown.js";
import { Player } from "./player.js";
import { recall, remember } from "./prefs.js";
import { drawRun, inspectionView, moveCursor, tokenDetail } from "./render.js";
import { Run } from "./run.js";
import { PipelineSocket } from "./socket.js";
import { PipelineStrip } from "./strip.js";
import { Tour } from "./tour.js";
import { showResampled, whatIfPanel } from "./what_if.js";

const $ = (id) => document.getElementById(id);
defineTerms();
const state = { run: null, lastRun: null, imported: null, released: null, asking: false, inspecting: null, resampling: false };

// --- what is on screen -------------------------------------------------------------------------------------------

const seen = new Set(); // stages in view: the others are drawn when they come into view
const watcher = new IntersectionObserver((entries) => {
  for (const entry of entries) {
    if (entry.isIntersecting) seen.add(entry.target.dataset.stage);
    else seen.delete(entry.target.dataset.stage);
  }
  if (state.run) player.schedule(state.run);
}, { rootMargin: "200px 0px" });
document.querySelectorAll(".stage").forEach((stage) => watcher.observe(stage));

function drawPipeline(run) {
  if (layout.open) drawRun(run, (stage) => seen.has(stage), () => player.schedule(run));
}

const layout = new Layout({ onOpen: () => state.run && drawPipeline(state.run) });
const strip = new PipelineStrip($("strip"), (stage) => layout.reveal(stage));
const tour = new Tour($("tour"));
const player = new Player((run) => {
  drawPipeline(run);
  strip.update(run);
  chat.draw(run);
  finishIfDone(run);
  tour.update(run);
});

// --- the socket --------------------------------------------------------------------------------------------------

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
    if (frame.type === "merges" || (frame.type === "error" && state.merging)) {
      state.merging = false;
      document.dispatchEvent(new CustomEvent("roundtrip:merges", { detail: frame }));
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
    if (status === "reconnected") {
      watchModelLoading(); // a restarted server loads its model again
      if (chat.conversation.id !== null && (!state.run || state.run.done)) chat.load(chat.conversation.id); // as kept
    }
    if (status === "reconnecting" && state.run && !state.run.done) {
      state.run.done = true;
      state.run.dropped = true;
      showError("The connection dropped during this answer; it was stopped (the server keeps what it wrote).");
      endTurn(state.run);
    }
  },
});
document.addEventListener("roundtrip:ask", (event) => { // a view asks the worker something about the shown run
  if (event.detail.type === "merges") state.merging = true;
  else state.asking = true;
  socket.send(event.detail);
});

// --- turns -------------------------------------------------------------------------------------------------------

// The sampling settings as the API takes them. "Greedy" (one click, beside Send) is the likeliest token every time:
// temperature 0 and no filter or penalty, whatever the fields say.
function params() {
  const out = {};
  const greedy = $("greedy").checked;
  const sampling = greedy ? [] : ["temperature", "top_p", "top_k", "min_p", "repetition_penalty"];
  for (const name of [...sampling, "max_tokens", "seed"]) {
    const raw = $(name).value.trim();
    if (raw !== "") out[name] = Number(raw);
  }
  if (greedy) out.temperature = 0;
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

const speed = () => document.querySelector('input[name="speed"]:checked').value;

function startRun(messages, extra) {
  showError("");
  const request = { type: "chat", model: $("model").value, messages, params: params(), level: $("level").value, step: speed() === "step", ...extra };
  // "complete this text": the last message's text as it is, without the chat template; the page keeps the messages
  // for its own drawing, the server gets the prompt alone
  if ($("mode").value === "complete") {
    request.prompt = messages.findLast((m) => m.role === "user").content;
    delete request.continue_final_message;
  }
  const { messages: _drawn, ...completion } = request;
  player.speed = speed() === "slow" ? "slow" : "live";
  const run = new Run(request);
  run.sentAt = performance.now();
  if (!socket.send(request.prompt === undefined ? request : completion)) {
    showError("Not connected to the server yet; try again in a moment.");
    return null;
  }
  state.run = run;
  setBusy(true);
  player.schedule(run);
  return run;
}

const chat = new Chat($("bubbles"), {
  start: startRun,
  system: () => $("system").value.trim(),
  copy,
  restore: (text) => {
    if (!$("prompt").value.trim()) $("prompt").value = text;
  },
  changed: (conversation) => {
    list.mark(conversation.id);
    if (conversation.system !== null) $("system").value = conversation.system;
    document.body.classList.toggle("chatting", conversation.id !== null);
  },
  failed: showError,
});

function finishIfDone(run) {
  if (!run.done || run.finishedHandled) return;
  run.finishedHandled = true;
  if (run.error) showError(run.error.message);
  endTurn(run);
}

// The turn is over (done, failed, or its socket dropped): the chat keeps what the server kept.
function endTurn(run) {
  setBusy(false);
  state.lastRun = run;
  $("export-run").disabled = false;
  $("replay-tour").disabled = false;
  if (run.replay) {
    chat.settleReplay(run);
    return;
  }
  if (run.dropped) chat.dropped(run);
  else chat.done(run, run.frames.findLast(({ frame }) => frame.type === "done")?.frame ?? null);
  if (!run.error) list.refresh();
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("cancel").disabled = !busy;
  $("next").disabled = !(busy && speed() === "step");
  $("next").hidden = speed() !== "step";
  // step mode's Next also sits in the token cursor, on top of the stages, so a reader can step where the change shows
  $("cursor-next").hidden = $("next").hidden;
  $("cursor-next").disabled = $("next").disabled;
  document.body.classList.toggle("busy", busy);
}

// A run the guided tour let go after its first token runs on in step mode: the page asks for each next token itself.
function keepGoing(run, frame) {
  if (state.released === run && frame.type === "trace" && frame.event.event === "text" && !run.lastSampled?.is_stop) resume(run);
}

// Step mode's "next": the wait since the last token was a pause (the run leaves it out of its latencies).
function resume(run) {
  if (!run || run.done) return;
  run.resumes.push(performance.now());
  socket.send({ type: "next" });
}

function showError(message) {
  const box = $("chat-error");
  box.textContent = message;
  box.hidden = !message;
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});

// Sends the composed message as a new turn (null when there is nothing to send or a turn is still going).
function send() {
  const prompt = $("prompt").value;
  if (!prompt.trim()) return null;
  if (tour.active && tour.run.done) tour.end(); // a new question after the tour: the visitor's own settings
  const run = chat.ask(prompt);
  if (run) $("prompt").value = "";
  return run;
}

$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("next").addEventListener("click", () => resume(state.run));
$("cursor-next").addEventListener("click", () => resume(state.run));
$("cancel").addEventListener("click", () => socket.send({ type: "cancel" }));
document.querySelectorAll('input[name="speed"]').forEach((r) => r.addEventListener("change", () => setBusy(Boolean(state.run && !state.run.done))));
setBusy(false);
$("greedy").checked = recall("greedy") === "yes";
$("greedy").addEventListener("change", () => remember("greedy", $("greedy").checked ? "yes" : "no"));

// What a tour switches (detail, greedy, speed, the pipeline open), to put back as the visitor had it when it ends.
function settingsNow() {
  return { level: $("level").value, greedy: $("greedy").checked, speed: speed(), open: layout.open };
}

function putBack(saved) {
  $("level").value = saved.level;
  $("greedy").checked = saved.greedy;
  document.querySelector(`input[name="speed"][value="${saved.speed}"]`).checked = true;
  layout.setOpen(saved.open, false);
  setBusy(Boolean(state.run && !state.run.done));
}

// The guided tour on a live run: the walkthrough's question unless one is typed, greedy at full detail, in step mode,
// so the engine waits after the first token while the tour walks the stages. Ending the tour (its End button, or the
// next question) puts the visitor's own settings back.
$("tour-start").addEventListener("click", (event) => {
  if (state.run && !state.run.done) return;
  tour.end();
  const saved = settingsNow();
  if (!$("prompt").value.trim()) $("prompt").value = event.currentTarget.dataset.question;
  $("level").value = "full";
  $("greedy").checked = true;
  document.querySelector('input[name="speed"][value="step"]').checked = true;
  layout.setOpen(true, false);
  const run = send();
  if (!run) {
    putBack(saved);
    return;
  }
  tour.start(
    run,
    () => {
      state.released = run;
      resume(run);
    },
    () => putBack(saved),
  );
});

// --- copying -----------------------------------------------------------------------------------------------------

// To the clipboard (where the browser allows it, else through a selection), and the button says so.
async function copy(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const box = el("textarea", { value: text, style: "position:fixed;opacity:0" });
    document.body.append(box);
    box.select();
    document.execCommand("copy");
    box.remove();
  }
  if (!button) return;
  const label = button.textContent;
  button.textContent = "Copied";
  setTimeout(() => (button.textContent = label), 1200);
}
copyCodeButtons($("bubbles"), copy);
copyCodeButtons($("pipeline"), copy); // the detokenization stage's rendered answer

// --- a token's trace ---------------------------------------------------------------------------------------------

$("bubbles").addEventListener("click", (event) => {
  const token = event.target.closest(".tok");
  const run = token && chat.view.answerOf(token)?.run;
  if (!run) return;
  const step = Number(token.dataset.step);
  moveCursor(run, step); // the pipeline's token stages go to it too
  // what if, and the recomputed detail, need the model's own logits: an upstream model's stay on its server
  const asks = run.tokenized && !run.upstream ? [whatIfPanel(run, step, (frame) => { state.resampling = true; socket.send(frame); }, (text) => {
    $("token-dialog").close();
    chat.branch(run, text);
  }), inspectButton(run, step)] : [];
  $("token-detail").replaceChildren(tokenDetail(run, step), ...asks, el("div", { id: "inspection" }));
  $("token-dialog").showModal();
});

// "Recompute the full detail for this token": the worker runs the pass that produced token `step` again.
function inspectButton(run, step) {
  const button = el("button", { type: "button", id: "inspect-token" }, "Recompute the full detail for this token");
  button.addEventListener("click", () => inspectToken(run, step, button));
  return button;
}

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

// --- conversations -----------------------------------------------------------------------------------------------

const list = new ConversationList($("conversations"), {
  open: (id) => {
    if (state.run && !state.run.done) return;
    chat.load(id);
    layout.setDrawer(false);
  },
  removed: (id) => {
    if (id === chat.conversation.id) chat.clear();
  },
  failed: showError,
});
document.body.addEventListener("htmx:afterSwap", (event) => {
  if (event.detail.target?.id === "conversations") list.mark(chat.conversation.id);
});

$("new-conversation").addEventListener("click", () => {
  if (state.run && !state.run.done) return;
  chat.clear();
  showError("");
  layout.setDrawer(false);
  $("prompt").focus();
});

// A reload reopens the conversation this browser was in.
const reopen = Number(recall("conversation"));
if (reopen) chat.load(reopen);

// --- record & replay ---------------------------------------------------------------------------------------------

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

$("replay-run").addEventListener("click", () => {
  layout.setDrawer(false);
  replay(false);
});
// The same tour over a recording, without the model: the replay holds after the first token as the engine would.
$("replay-tour").addEventListener("click", () => {
  tour.end();
  layout.setDrawer(false);
  const open = layout.open;
  layout.setOpen(true, false);
  const run = replay(true);
  if (run) tour.start(run, run.release, () => layout.setOpen(open, false));
});

// Plays the imported recording (else this page's last run) into a new run; `hold`: stop after its first token until
// run.release() is called.
function replay(hold) {
  const recorded = state.imported ?? state.lastRun?.toJSON();
  if (!recorded || (state.run && !state.run.done)) return null;
  const run = new Run(recorded.request);
  run.replay = true;
  state.run = run;
  chat.replayed(run);
  setBusy(true);
  player.speed = speed() === "slow" ? "slow" : "live";
  run.release = player.replay(run, recorded, hold);
  return run;
}

// --- the model loading -------------------------------------------------------------------------------------------

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
    // an upstream model loads nothing here: whether its servers are up is its card's news
    const model = health ? Object.entries(health.models).find(([, s]) => s.state !== "ready" && !s.upstream) : null;
    if (health && !model) {
      box.hidden = true;
      await modelCard.refresh();
      return;
    }
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
const modelCard = new ModelCard($("model-card"), $("model"), $("mode"), $("prompt"));
watchModelLoading();
