// The forward stage's attention at `full` level, for a chosen layer, head and query token: every head of the layer
// as a labelled heatmap, the head view (bertviz-like lines), the token × token matrix of the chosen head (one row
// per token the run fed: the prompt's last token, then each answer token; the trace has no rows for the other
// prompt tokens, which the worker recomputes for one layer on demand), and the layer × head overview. Built from the
// run's forward events, so replay shows it too. The on-demand matrix goes out as a "roundtrip:ask" document event
// (the page's socket sends it) and comes back as "roundtrip:prompt-attention".
import { el, field } from "./dom.js";
import { attentionCell, drawHeads, groupSize, headLabel, positionLabel, queryPosition } from "./attention.js";
import { AttentionFinder } from "./attention_finder.js";
import { HeadView } from "./head_view.js";
import { Heatmap } from "./heatmap.js";

const MATRIX_MS = 1000;

export class AttentionView {
  // onPaint(forward, layer): told whenever the shown query token or layer changes, for views of the same token.
  constructor(onPaint = () => {}) {
    this.onPaint = onPaint;
    this.run = null;
    this.rows = []; // the forwards that carry attention, in order: one query token each
    this.query = null; // the picked query's position; null follows the newest token
    this.matrixAt = -Infinity;
    this.heads = new Heatmap(field("forward", "heads"), "attention of every head of the layer for the query token");
    this.headView = new HeadView(field("forward", "head-view"), (position) => this.pickQuery(position));
    this.matrix = new Heatmap(field("forward", "matrix"), "attention of the chosen head, query token by key token",
      (r) => this.pickRow(r));
    this.overview = new Heatmap(field("forward", "overview"), "largest attention weight of every head in every layer", (h, layer) => {
      field("forward", "layer-pick").value = String(layer);
      field("forward", "head-pick").value = String(h);
      this.paint();
    });
    for (const name of ["layer-pick", "head-pick", "group-pick"]) field("forward", name).oninput = () => this.paint();
    this.prompt = null; // {run, layer, attention [heads, T, T]}: every prompt row of one layer, recomputed
    field("forward", "matrix-full").onclick = () => this.askPromptRows();
    document.addEventListener("roundtrip:prompt-attention", (event) => this.receivePromptRows(event.detail));
    field("forward", "query-pick").onchange = (event) => this.pickQuery(event.target.value === "" ? null : Number(event.target.value));
    this.finder = new AttentionFinder((layer, head, position) => {
      field("forward", "layer-pick").value = String(layer);
      field("forward", "head-pick").value = String(head);
      field("forward", "group-pick").checked = false;
      this.pickQuery(position);
    });
  }

  // `shown`: the forward the page's token cursor is on, the query while none is picked here.
  update(run, shown = null) {
    this.run = run;
    this.shown = shown?.detail ? shown : null;
    this.rows = run.forwards.filter((f) => f.detail);
    const [layers, heads] = this.rows[this.rows.length - 1].detail.attention.shape;
    field("forward", "layer-pick").max = String(layers - 1);
    const headPick = field("forward", "head-pick");
    if (headPick.options.length !== heads) {
      const group = groupSize(run, heads);
      headPick.replaceChildren(...Array.from({ length: heads }, (_, h) => el("option", { value: String(h) }, headLabel(h, group).title)));
    }
    const queryPick = field("forward", "query-pick");
    if (!queryPick.options.length) queryPick.append(el("option", { value: "" }, "the token the cursor is on"));
    queryPick.append(...this.rows.slice(queryPick.options.length - 1).map((f) => {
      const p = queryPosition(f);
      return el("option", { value: String(p) }, `${positionLabel(run, p).label} · position ${p}`);
    }));
    queryPick.value = this.query === null ? "" : String(this.query);
    this.finder.update(run, this.rows, this.selected());
    this.paint(!run.done);
  }

  askPromptRows() {
    const layer = this.layer();
    this.asked = { run: this.run, layer };
    field("forward", "matrix-status").textContent = `recomputing layer ${layer} for every prompt token…`;
    document.dispatchEvent(new CustomEvent("roundtrip:ask", {
      detail: { type: "prompt_attention", model: this.run.request.model, ids: this.run.tokenized.ids, layer },
    }));
  }

  receivePromptRows(frame) {
    const status = field("forward", "matrix-status");
    if (frame.type === "error") {
      status.textContent = frame.message;
      return;
    }
    this.prompt = { run: this.asked?.run, layer: frame.layer, attention: frame.attention };
    status.textContent = `every prompt row of layer ${frame.layer}, recomputed (${frame.attention.shape[1]} positions)`;
    this.paint();
  }

  layer() {
    return Math.min(Number(field("forward", "layer-pick").value), this.selected().detail.attention.shape[0] - 1);
  }

  // A matrix row picked: the query it is, if the run carries that token's full detail (recomputed prompt rows do not).
  pickRow(r) {
    const position = this.matrixRows[r];
    if (this.rows.some((f) => queryPosition(f) === position)) this.pickQuery(position);
  }

  pickQuery(position) {
    this.query = position;
    field("forward", "query-pick").value = position === null ? "" : String(position);
    this.paint();
  }

  selected() {
    return this.rows.find((f) => queryPosition(f) === this.query) ?? this.shown ?? this.rows[this.rows.length - 1];
  }

  // `streaming`: the token × token matrix, which grows with every token, is redrawn at most every MATRIX_MS.
  paint(streaming = false) {
    const run = this.run;
    const forward = this.selected();
    const attention = forward.detail.attention;
    const [layers, heads] = attention.shape;
    const layer = Math.min(Number(field("forward", "layer-pick").value), layers - 1);
    const head = Math.min(Number(field("forward", "head-pick").value), heads - 1);
    const group = groupSize(run, heads);
    const query = positionLabel(run, queryPosition(forward));
    field("forward", "layer-label").textContent =
      `layer ${layer} of ${layers - 1} · ${heads} heads over ${attention.shape[2]} positions · query “${query.label}” at position ${query.position}` +
      windowNote(run, layer, query.position);
    drawHeads(this.heads, run, attention, layer);
    this.saySink(attention, layer, head);
    const shown = field("forward", "group-pick").checked ? Array.from({ length: group }, (_, k) => Math.floor(head / group) * group + k) : [head];
    this.headView.draw({
      tokens: attention.positions.map((p) => positionLabel(run, p)),
      query: attention.positions.indexOf(query.position),
      heads: shown.map((h) => ({ head: h, weights: attention.positions.map((_, i) => attentionCell(attention, layer, h, i).weight) })),
      pickable: new Set(this.rows.map(queryPosition)),
    });
    const now = performance.now();
    if (!streaming || now - this.matrixAt >= MATRIX_MS) {
      this.matrixAt = now;
      this.drawMatrix(layer, head);
    }
    this.drawOverview(attention);
    this.onPaint(forward, layer);
  }

  // A head that puts most of its weight on position 0 is parking it there (an attention sink): said, so that a
  // heatmap bright only at the first token is not read as the model finding that token important.
  saySink(attention, layer, head) {
    const line = field("forward", "sink");
    const first = attention.positions[0] === 0 ? attentionCell(attention, layer, head, 0).weight : 0;
    line.hidden = first < 0.5;
    if (line.hidden) return;
    const token = positionLabel(this.run, 0).label;
    line.textContent = `Head ${head} of layer ${layer} puts ${(first * 100).toFixed(0)}% of its weight on position 0 (“${token}”): an attention sink, ` +
      "where heads park their attention when nothing else is relevant to them; it carries little information. Try another head, or the finder above.";
  }

  // The chosen head across the run: rows are query tokens, columns every position any of them saw. With the prompt's
  // rows recomputed for this layer, every prompt token is a row too.
  drawMatrix(layer, head) {
    const run = this.run;
    const full = this.prompt?.run === run && this.prompt.layer === layer ? this.prompt.attention : null;
    const promptRows = full ? full.shape[1] : 0;
    const fed = this.rows.filter((f) => queryPosition(f) >= promptRows); // the prompt's last row comes from `full` then
    const positions = [...new Set([...Array(promptRows).keys(), ...fed.flatMap((f) => f.detail.attention.positions)])].sort((a, b) => a - b);
    const index = fed.map((f) => new Map(f.detail.attention.positions.map((p, i) => [p, i])));
    const rows = [...Array(promptRows).keys()].map((p) => positionLabel(run, p)).concat(fed.map((f) => positionLabel(run, queryPosition(f))));
    const cols = positions.map((p) => positionLabel(run, p));
    this.matrixRows = rows.map((label) => label.position);
    const window = run.context?.layer_windows?.[layer] ?? 0; // 0: this layer sees every earlier position
    const outside = (r, c) => window > 0 && positions[c] <= rows[r].position - window;
    this.matrix.draw({
      rows,
      cols,
      cell: (r, c) => {
        if (outside(r, c)) return null;
        if (r < promptRows) return positions[c] <= r ? attentionCell(full, head, r, positions[c]) : null; // [heads, T, T]
        const i = index[r - promptRows].get(positions[c]);
        return i === undefined ? null : attentionCell(fed[r - promptRows].detail.attention, layer, head, i);
      },
      outside,
      describe: (r, c, cell) => `layer ${layer}, head ${head}: ${rows[r].title} → ${cols[c].title}: ` +
        (cell ? `weight ${cell.weight.toFixed(4)}` : outside(r, c) ? `outside this layer's window (it sees the last ${window} positions)` : "not attended (a later position, or outside the positions sent)"),
      corner: "key token \\ query token",
    });
  }

  drawOverview(attention) {
    const run = this.run;
    const [layers, heads, positions] = attention.shape;
    const group = groupSize(run, heads);
    // the position each head weighs most: its 8-bit row reaches 255 there
    const strongest = (layer, h) => {
      for (let i = 0; i < positions; i++) if (attentionCell(attention, layer, h, i).shade === 1) return positionLabel(run, attention.positions[i]);
      return null;
    };
    this.overview.draw({
      rows: Array.from({ length: heads }, (_, h) => headLabel(h, group)),
      cols: Array.from({ length: layers }, (_, l) => ({ label: String(l), title: `layer ${l}` })),
      cell: (h, l) => ({ shade: Math.min(1, attention.row_max[l][h]), weight: attention.row_max[l][h] }),
      describe: (h, l, cell) => `layer ${l}, head ${h}: largest weight ${cell.weight.toFixed(4)}, on ${strongest(l, h)?.title ?? "?"}`,
      corner: "layer",
    });
  }
}

// What a layer sees, where the model's layers differ (Gemma 3: five local layers to one global): a local layer's
// query attends only to its last `window` positions, the earlier ones get no weight.
function windowNote(run, layer, position) {
  const windows = run?.context?.layer_windows ?? [];
  if (!windows.some((w) => w > 0)) return "";
  const w = windows[layer] ?? 0;
  if (!w) return " · global layer: sees every earlier token";
  const first = Math.max(0, position + 1 - w);
  return ` · local layer: sees the last ${w} tokens (${first > 0 ? `positions ${first}–${position}` : `all ${position + 1} here`})`;
}
