// A head view in the manner of bertviz: the tokens twice, queries on the left and keys on the right, and a line
// from the query token to every key it attends to, as strong as the weight. Several heads (a key/value group)
// draw in colours of their own. Left tokens that were a query in this run can be picked.
import { el } from "./dom.js";
import { roving } from "./roving.js";

const ROW_H = 18;
const SVG_NS = "http://www.w3.org/2000/svg";
const HEAD_COLOURS = ["#2563eb", "#db2777", "#059669", "#ea580c", "#7c3aed", "#0891b2", "#ca8a04", "#dc2626"];

export class HeadView {
  // onPick(position): a left token that has its own attention in the trace was chosen as the query.
  constructor(host, onPick) {
    this.onPick = onPick;
    this.box = el("div", { class: "head-view" });
    this.legend = el("p", { class: "muted head-legend" });
    host.append(this.legend, this.box);
  }

  // tokens: [{label, kind, title, position}] (the keys, in order); query: index into tokens;
  // heads: [{head, weights: [per token]}]; pickable: positions that can be queries.
  draw({ tokens, query, heads, pickable }) {
    const width = 120;
    const svg = document.createElementNS(SVG_NS, "svg");
    svg.setAttribute("width", String(width));
    svg.setAttribute("height", String(tokens.length * ROW_H));
    svg.setAttribute("aria-hidden", "true");
    const strongest = Math.max(1e-12, ...heads.flatMap((h) => h.weights));
    heads.forEach(({ head, weights }, n) => {
      weights.forEach((w, k) => {
        const line = document.createElementNS(SVG_NS, "line");
        const attrs = { x1: 0, y1: (query + 0.5) * ROW_H, x2: width, y2: (k + 0.5) * ROW_H, stroke: HEAD_COLOURS[n % HEAD_COLOURS.length],
          "stroke-width": 1 + 3 * (w / strongest), "stroke-opacity": (w / strongest).toFixed(3), "data-head": head, "data-weight": w.toFixed(4) };
        for (const [name, value] of Object.entries(attrs)) line.setAttribute(name, String(value));
        const title = document.createElementNS(SVG_NS, "title");
        title.textContent = `head ${head} → ${tokens[k].title}: weight ${w.toFixed(4)}`;
        line.append(title);
        svg.append(line);
      });
    });
    const left = el("div", { class: "hv-col hv-queries", "data-rove": ".hv-tok[data-pick]" });
    const right = el("ol", { class: "hv-col hv-keys" });
    tokens.forEach((t, k) => {
      const side = el("span", { class: `hv-tok seg-${t.kind ?? "markup"}${k === query ? " query" : ""}`, title: t.title, style: `height:${ROW_H}px` }, t.label);
      if (pickable.has(t.position)) {
        side.dataset.pick = String(t.position);
        side.addEventListener("click", () => this.onPick(t.position));
      }
      left.append(side);
      const total = heads.map(({ head, weights }) => `head ${head} ${weights[k].toFixed(4)}`).join(", ");
      right.append(el("li", { class: `hv-tok seg-${t.kind ?? "markup"}`, title: `${t.title}: ${total}`, style: `height:${ROW_H}px` }, t.label));
    });
    this.box.replaceChildren(left, svg, right);
    roving(left);
    this.legend.replaceChildren(
      document.createTextNode(`query ${tokens[query]?.title ?? ""}; line strength relative to the strongest weight (${strongest.toFixed(4)}). `),
      ...heads.map(({ head }, n) => el("span", { class: "hv-key", style: `color:${HEAD_COLOURS[n % HEAD_COLOURS.length]}` }, `■ head ${head} `)),
    );
    this.box.scrollTop = Math.max(0, (query - 4) * ROW_H);
  }
}
