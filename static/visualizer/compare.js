// The comparison page: one text read by two models (the socket's "compare" question). Their tokens side by side, the
// places where both tokenizers cut marked, and their likeliest next tokens lined up by the text they spell.
import { el } from "./dom.js";
import { PipelineSocket } from "./socket.js";

const $ = (id) => document.getElementById(id);
const percent = (p) => `${(100 * p).toFixed(p < 0.001 ? 3 : 1)} %`;
const visible = (text) => text.replaceAll(" ", "·").replaceAll("\n", "↵").replaceAll("\t", "⇥");

const socket = new PipelineSocket("/ws/pipeline/", {
  onFrame(frame) {
    if (frame.type === "comparison") show(frame);
    else if (frame.type === "error") fail(frame.message);
    else return;
    $("compare-run").disabled = false;
  },
  onStatus(status) {
    const line = $("socket-status");
    if (!line) return;
    line.className = `status ${status}`;
    line.textContent = { connected: "connected", reconnected: "reconnected", reconnecting: "connection lost — reconnecting…" }[status];
  },
});

$("compare-form").addEventListener("submit", (event) => {
  event.preventDefault();
  fail("");
  const frame = { type: "compare", models: [$("model-a").value, $("model-b").value], text: $("compare-text").value };
  if (!socket.send(frame)) return fail("Not connected to the server yet; try again in a moment.");
  $("compare-run").disabled = true;
});

function fail(message) {
  $("compare-error").hidden = !message;
  $("compare-error").textContent = message;
}

// Character offsets where a side's tokens end (the cuts it makes in the text).
const cuts = (side) => new Set(side.spans.map(([, end]) => end).filter((end) => end > 0));

function show(frame) {
  const [a, b] = frame.sides;
  const shared = [...cuts(a)].filter((c) => cuts(b).has(c));
  const sides = $("compare-tokens").querySelector('[data-field="sides"]');
  sides.replaceChildren(...frame.sides.map((side) => tokenRow(side, cuts(side === a ? b : a))));
  $("compare-tokens").querySelector('[data-field="cuts"]').textContent =
    `${a.model}: ${a.ids.length} tokens (${a.tokenizer}); ${b.model}: ${b.ids.length} tokens (${b.tokenizer}); ` +
    `both cut the text at ${shared.length} of ${new Set([...cuts(a), ...cuts(b)]).size} places.`;
  $("compare-tokens").hidden = false;
  nextTokens(a, b);
  $("compare-next").hidden = false;
}

// One side's tokens: the piece as its vocabulary writes it ("▁the", "Ġthe", "<0xF0>"), its id, and whether the other
// model cuts the text at the same place after it.
function tokenRow(side, other) {
  const row = el("div", { class: "compare-side" });
  row.append(el("h4", {}, side.model));
  const chips = el("div", { class: "chips" });
  side.ids.forEach((id, i) => {
    const [start, end] = side.spans[i];
    const lone = start === end; // a BOS or other markup the model puts in front
    const chip = el("span", { class: `chip${lone ? " special" : ""}${!lone && other.has(end) ? " shared-cut" : ""}`, "data-id": String(id), title: `id ${id}, characters ${start}–${end}` });
    chip.append(el("span", { class: "tok-text" }, side.pieces[i]), " ", el("span", { class: "tok-id" }, String(id)));
    chips.append(chip);
  });
  row.append(chips);
  return row;
}

// The union of both sides' likeliest next tokens, by the text they spell, each with both probabilities.
function nextTokens(a, b) {
  const table = $("compare-next");
  table.querySelector('[data-field="head-a"]').textContent = a.model;
  table.querySelector('[data-field="head-b"]').textContent = b.model;
  const rows = new Map();
  for (const [side, key] of [[a, "a"], [b, "b"]]) {
    for (const likely of side.likely) {
      const row = rows.get(likely.token) ?? { token: likely.token };
      row[key] = likely.prob;
      rows.set(likely.token, row);
    }
  }
  const ordered = [...rows.values()].sort((x, y) => Math.max(y.a ?? 0, y.b ?? 0) - Math.max(x.a ?? 0, x.b ?? 0));
  table.querySelector('[data-field="rows"]').replaceChildren(
    ...ordered.map((row) => {
      const tr = el("tr", { class: row.a !== undefined && row.b !== undefined ? "both" : "" });
      tr.append(el("th", { scope: "row" }, visible(row.token)), cell(row.a), cell(row.b));
      return tr;
    }),
  );
}

function cell(prob) {
  const td = el("td");
  if (prob === undefined) {
    td.append(el("span", { class: "muted" }, "not in its top 10"));
    return td;
  }
  td.append(el("span", { class: "bar", style: `width: ${Math.max(2, 100 * prob)}%` }), el("span", { class: "num" }, percent(prob)));
  return td;
}
