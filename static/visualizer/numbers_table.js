// A chart's numbers as a table behind a "numbers" toggle: what the picture shows, reachable by screen readers,
// selectable and copyable. The table is built only while open (a chart may update every token).
import { el } from "./dom.js";

export class NumbersTable {
  constructor(caption) {
    this.caption = caption;
    this.columns = [];
    this.rows = [];
    this.element = el("details", { class: "numbers" });
    this.element.append(el("summary", {}, "numbers"));
    this.element.addEventListener("toggle", () => this.render());
  }

  // columns: header texts; rows: arrays of cells (numbers or text), one per column.
  update(columns, rows) {
    this.columns = columns;
    this.rows = rows;
    if (this.element.open) this.render();
  }

  render() {
    const old = this.element.querySelector("table");
    if (!this.element.open) {
      old?.remove();
      return;
    }
    const table = el("table");
    table.append(el("caption", {}, this.caption));
    const head = el("tr");
    for (const c of this.columns) head.append(el("th", { scope: "col" }, c));
    table.append(el("thead"), el("tbody"));
    table.tHead.append(head);
    for (const row of this.rows) {
      const tr = el("tr");
      row.forEach((cell, i) => tr.append(el(i ? "td" : "th", i ? {} : { scope: "row" }, format(cell))));
      table.tBodies[0].append(tr);
    }
    if (old) old.replaceWith(table);
    else this.element.append(table);
  }
}

function format(cell) {
  if (cell === null || cell === undefined) return "—";
  if (typeof cell !== "number") return String(cell);
  return Number.isInteger(cell) ? String(cell) : cell.toFixed(Math.abs(cell) < 1 ? 4 : 2);
}
