// The attention finder: pick a query token and a key token, and every layer's every head is ranked by the weight the
// query gives the key, one click opening each in the attention view. On the walkthrough's question it offers the
// walkthrough's own pair (the answer's "·India" reading "·capital") as a preset. Built from the run's forward events,
// so a replay finds the same heads.
import { el, field, visible } from "./dom.js";
import { SEGMENT_LABELS, tokenAt } from "./tokens.js";
import { attentionCell, positionLabel, queryPosition } from "./attention.js";

const SHOWN = 8; // the strongest layer/head pairs listed
const WALKTHROUGH = { question: "What's the capital of India?", query: " India", key: " capital" };

// [{layer, head, weight}] for the key at index `i` of the forward's attention positions, strongest first.
function rankHeads(attention, i) {
  const [layers, heads] = attention.shape;
  const ranked = [];
  for (let layer = 0; layer < layers; layer++) {
    for (let head = 0; head < heads; head++) ranked.push({ layer, head, weight: attentionCell(attention, layer, head, i).weight });
  }
  return ranked.sort((a, b) => b.weight - a.weight);
}

export class AttentionFinder {
  // open(layer, head, queryPosition): show that head for that query in the attention view.
  constructor(open) {
    this.open = open;
    this.run = null;
    this.rows = [];
    this.query = field("forward", "finder-query");
    this.key = field("forward", "finder-key");
    this.list = field("forward", "finder-list");
    this.preset = field("forward", "finder-preset");
    this.query.onchange = () => {
      this.fillKeys();
      this.rank();
    };
    this.key.onchange = () => this.rank();
    this.preset.onclick = () => this.usePreset();
    this.list.onclick = (event) => {
      const item = event.target.closest("button[data-layer]");
      if (item) this.open(Number(item.dataset.layer), Number(item.dataset.head), Number(this.query.value));
    };
  }

  // rows: the run's forwards that carry attention, one query token each; `shown`: the query the view shows now.
  update(run, rows, shown) {
    const fresh = this.run !== run || this.query.options.length > rows.length;
    this.run = run;
    this.rows = rows;
    if (fresh) this.query.replaceChildren();
    const had = this.query.options.length;
    this.query.append(...rows.slice(had).map((f) => {
      const p = queryPosition(f);
      return el("option", { value: String(p) }, `${positionLabel(run, p).label} · position ${p}`);
    }));
    if (fresh || !had) {
      this.query.value = String(queryPosition(shown));
      this.fillKeys();
      this.rank();
    }
    this.offerPreset();
  }

  forward() {
    return this.rows.find((f) => queryPosition(f) === Number(this.query.value)) ?? null;
  }

  // The keys a query can read: itself and the positions before it that the trace carries.
  fillKeys() {
    const forward = this.forward();
    const before = this.key.value;
    this.key.replaceChildren(...(forward?.detail.attention.positions ?? []).map((p) =>
      el("option", { value: String(p) }, `${positionLabel(this.run, p).label} · position ${p} (${SEGMENT_LABELS[tokenAt(this.run, p)?.kind] ?? "?"})`)));
    if ([...this.key.options].some((o) => o.value === before)) this.key.value = before;
    else if (this.key.options.length > 1) this.key.selectedIndex = 1; // past the sink on position 0
  }

  rank() {
    const forward = this.forward();
    if (!forward || this.key.value === "") {
      this.list.replaceChildren();
      return;
    }
    const attention = forward.detail.attention;
    const i = attention.positions.indexOf(Number(this.key.value));
    const query = positionLabel(this.run, queryPosition(forward)).label;
    const key = positionLabel(this.run, Number(this.key.value)).label;
    this.list.replaceChildren(...rankHeads(attention, i).slice(0, SHOWN).map(({ layer, head, weight }) => {
      const item = el("li");
      item.append(el("button", { type: "button", class: "link", "data-layer": String(layer), "data-head": String(head), "data-weight": weight.toFixed(6) },
        `layer ${layer}, head ${head}: “${query}” gives “${key}” ${(weight * 100).toFixed(1)}% of its attention`));
      return item;
    }));
  }

  // The walkthrough's pair, when this run asked its question and the answer has the token.
  walkthroughPair() {
    const run = this.run;
    const asked = run.request.messages?.findLast((m) => m.role === "user")?.content;
    if (asked !== WALKTHROUGH.question || !run.tokenized) return null;
    const prompt = run.tokenized.ids.length;
    const named = (p, text) => tokenAt(run, p)?.text === text;
    const forward = this.rows.find((f) => queryPosition(f) >= prompt && named(queryPosition(f), WALKTHROUGH.query));
    if (!forward) return null;
    // "·capital" is in the question and again in the answer: the one this query reads most, in its strongest head
    const attention = forward.detail.attention;
    const keys = attention.positions.map((p, i) => [p, i]).filter(([p]) => named(p, WALKTHROUGH.key));
    if (!keys.length) return null;
    const [key] = keys.map(([p, i]) => [p, rankHeads(attention, i)[0].weight]).sort((a, b) => b[1] - a[1])[0];
    return { query: queryPosition(forward), key };
  }

  offerPreset() {
    const pair = this.walkthroughPair();
    this.preset.hidden = !pair;
    if (pair) this.preset.textContent = `The walkthrough's example: “${visible(WALKTHROUGH.query)}” → “${visible(WALKTHROUGH.key)}”`;
  }

  // Ranks the walkthrough's pair and opens its strongest head.
  usePreset() {
    const pair = this.walkthroughPair();
    if (!pair) return;
    this.query.value = String(pair.query);
    this.fillKeys();
    this.key.value = String(pair.key);
    this.rank();
    const best = this.list.querySelector("button[data-layer]");
    if (best) best.click();
  }
}
