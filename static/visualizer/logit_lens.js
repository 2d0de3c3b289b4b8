// The logit lens as a table: for each layer looked at, the model's best guess for the next token if the residual
// stream were read out (final norm and output head) right after that layer's attention half, and after its
// feed-forward half. Shared by the live forward stage and the recomputed detail of a clicked token.
import { el, visible } from "./dom.js";

const guessText = (g) => `${visible(g.token)} ${(g.prob * 100).toFixed(1)}%`;

// `selected`: a layer whose row is marked (the layer the page shows).
export function lensTable(detail, selected = null) {
  const halfway = new Map((detail.logit_lens_after_attention ?? []).map((g) => [g.layer, g])); // older recordings: none
  const table = el("table", { class: "lens" });
  table.append(el("caption", { class: "muted" }, "logit lens: the best next-token guess read out after each half of a layer"));
  const head = el("tr");
  for (const text of ["layer", "after attention", "after feed-forward"]) head.append(el("th", { scope: "col" }, text));
  table.append(el("thead"), el("tbody"));
  table.tHead.append(head);
  for (const g of detail.logit_lens) {
    const mid = halfway.get(g.layer);
    const row = el("tr", { class: g.layer === selected ? "picked" : "", "data-layer": String(g.layer) });
    row.append(
      el("th", { scope: "row" }, String(g.layer)),
      el("td", { title: mid ? `after layer ${g.layer}'s attention: token ${mid.id}` : "" }, mid ? guessText(mid) : "—"),
      el("td", { title: `after layer ${g.layer}: token ${g.id}` }, guessText(g)),
    );
    table.tBodies[0].append(row);
  }
  return table;
}
