// Rotary position embedding (RoPE) with the model's own numbers: before attention compares queries with keys, each
// head's vector is taken as pairs of dimensions and pair i of a token at position p is turned by the angle
// p × base^(−2i/d). Shown for one token's position beside the same token at another position, to say what
// shuffling the order would change. base and d come from the run's context event (the model's config).
import { el } from "./dom.js";
import { positionLabel } from "./attention.js";

const TURN = 2 * Math.PI;

// A few pairs spread from the fastest-turning (i = 0) to the slowest (the last).
function pairs(half) {
  return [...new Set([0, 1, 2, 4, 8, 16, half - 1].filter((i) => i < half))];
}

// An angle in degrees after whole turns, in [0, 360).
function degrees(angle) {
  const deg = (((angle % TURN) + TURN) % TURN) * (180 / Math.PI);
  return `${(deg >= 359.95 ? 0 : deg).toFixed(1)}°`;
}

const angle = (value) => `${value.toFixed(3)} (${degrees(value)})`;

// run: whose context says base and d; position: the token to explain; length: positions so far.
export function drawRope(node, run, position, length) {
  const c = run.context;
  if (!c?.rope_dim) return; // not yet, or a recording made before the context carried the model's RoPE numbers
  const half = c.rope_dim / 2;
  const token = positionLabel(run, position);
  const other = (position + Math.floor(length / 2)) % length; // its place if the sequence's two halves swapped
  const table = el("table", { class: "rope" });
  table.append(el("caption", {}, `angles in radians (degrees after whole turns) for “${token.label}” at position ${position}, and at position ${other}`));
  const head = el("tr");
  for (const text of ["pair i", "θᵢ, rad per position", `angle at ${position}`, `angle at ${other}`, "difference"]) {
    head.append(el("th", { scope: "col" }, text));
  }
  table.append(el("thead"), el("tbody"));
  table.tHead.append(head);
  for (const i of pairs(half)) {
    const theta = c.rope_base ** ((-2 * i) / c.rope_dim);
    const row = el("tr");
    row.append(
      el("th", { scope: "row" }, String(i)),
      el("td", {}, theta.toPrecision(4)),
      el("td", {}, angle(position * theta)),
      el("td", {}, angle(other * theta)),
      el("td", {}, degrees((other - position) * theta)),
    );
    table.tBodies[0].append(row);
  }
  node.replaceChildren(
    el("p", { class: "muted" },
      `Positions inside the forward pass (rotary position embedding, RoPE): each head's query and key vectors are read as ` +
      `${half} pairs of numbers, and pair i of the token at position p is turned by the angle p × θᵢ, with θᵢ = base^(−2i/d), ` +
      `base ${c.rope_base} and d = ${c.rope_dim} rotary dimensions (this model's own). Pair 0 turns fastest, the last pair barely moves.`),
    table,
    el("p", { class: "muted" },
      `Shuffle the words and the same token gets other angles: if the two halves of these ${length} positions swapped places, ` +
      `“${token.label}” would stand at position ${other} and every pair would be turned by the difference shown. Attention multiplies a rotated query ` +
      `with rotated keys, so what survives is the difference of their positions, (p − s) × θᵢ: the model knows how far apart two ` +
      `tokens are, and a shuffled sentence gives other attention scores even though it has the same words.`),
  );
}
