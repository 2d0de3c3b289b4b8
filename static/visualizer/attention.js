// The trace's attention, read. A forward pass at `full` level carries the weights of the token it fed last (the
// query) over the cached positions it saw: [layers, heads, positions] as 8-bit rows, each scaled to its own
// maximum (`row_max`), over the positions listed in `positions` (webapp/worker/serialize.py).
import { visible } from "./dom.js";
import { describeToken, tokenAt } from "./tokens.js";

const decoded = new WeakMap();

function bytesOf(attention) {
  if (!decoded.has(attention)) {
    const raw = atob(attention.data);
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    decoded.set(attention, bytes);
  }
  return decoded.get(attention);
}

// {shade: the weight relative to its row's largest, weight: the weight itself (to 8 bits)} for the i-th listed position.
export function attentionCell(attention, layer, head, i) {
  const [, heads, positions] = attention.shape;
  const shade = bytesOf(attention)[(layer * heads + head) * positions + i] / 255;
  return { shade, weight: shade * attention.row_max[layer][head] };
}

// Query heads that share one key/value head, from the model's shape in the context event (a recording made
// before the event carried it: every head its own group).
export function groupSize(run, heads) {
  const kv = run?.context?.n_kv_heads ?? heads;
  return heads % kv === 0 ? heads / kv : 1;
}

// The forward's query: the last token it fed, at the last cached position.
export function queryPosition(forward) {
  return forward.kv_length - 1;
}

// A heatmap or head-view label for a position: its token, coloured by its segment.
export function positionLabel(run, position) {
  const token = tokenAt(run, position);
  return token ? { label: visible(token.text), kind: token.kind, title: describeToken(token), position } : { label: `#${position}`, title: `position ${position}`, position };
}

export function headLabel(head, group) {
  return { label: `head ${head}`, title: `head ${head} (key/value head ${Math.floor(head / group)})` };
}

// Every head of one layer for one query token: a row per head, a column per cached position.
export function drawHeads(heatmap, run, attention, layer) {
  const heads = attention.shape[1];
  const group = groupSize(run, heads);
  const cols = attention.positions.map((p) => positionLabel(run, p));
  heatmap.draw({
    rows: Array.from({ length: heads }, (_, h) => headLabel(h, group)),
    cols,
    cell: (h, i) => attentionCell(attention, layer, h, i),
    describe: (h, i, cell) => `layer ${layer}, head ${h} → ${cols[i].title}: weight ${cell.weight.toFixed(4)}`,
    corner: "key token",
  });
}
