// A heatmap you can read: a canvas of cells with a label on every row and column, a line of text naming the cell
// under the pointer or the keyboard cursor (arrow keys on the focused canvas), and every number as a table.
import { el } from "./dom.js";
import { NumbersTable } from "./numbers_table.js";

const ROW_H = 16;
const MIN_COL = 16; // a column label's vertical text needs this much
const MAX_COL = 30;
const FALLBACK_WIDTH = 560; // a host not laid out yet (a dialog about to open)

// dark blue → yellow, for a shade in [0, 1]
export function shadeColour(shade) {
  return `rgb(${Math.round(20 + 235 * shade)},${Math.round(30 + 200 * shade)},${Math.round(90 - 60 * shade)})`;
}

export class Heatmap {
  // onPick(row, col): a click on a cell or Enter on the keyboard cursor.
  constructor(host, caption, onPick = null) {
    this.onPick = onPick;
    this.caption = caption;
    this.spec = null;
    this.cursor = null;
    this.canvas = el("canvas", { tabIndex: 0, class: "hm-canvas" });
    this.canvas.setAttribute("role", "img");
    this.canvas.setAttribute("aria-label", `${caption}; arrow keys move between cells, the cell is described below`);
    this.marker = el("div", { class: "hm-cursor", hidden: true });
    this.rowLabels = el("div", { class: "hm-rows" });
    this.colLabels = el("div", { class: "hm-cols" });
    const plot = el("div", { class: "hm-plot" });
    plot.append(this.canvas, this.marker);
    const grid = el("div", { class: "hm-grid" });
    grid.append(el("div"), this.colLabels, this.rowLabels, plot);
    this.scroll = el("div", { class: "hm-scroll" });
    this.scroll.append(grid);
    this.tip = el("p", { class: "hm-tip muted", role: "status" }, "Point at a cell, or focus the map and use the arrow keys.");
    this.table = new NumbersTable(caption);
    this.figure = el("figure", { class: "hm" });
    this.figure.append(this.scroll, this.tip, this.table.element);
    host.append(this.figure);
    this.canvas.addEventListener("mousemove", (event) => this.point(event));
    this.canvas.addEventListener("click", (event) => this.point(event) && this.pick());
    this.canvas.addEventListener("keydown", (event) => this.key(event));
    this.canvas.addEventListener("focus", () => this.show(this.cursor ?? [0, 0]));
  }

  // rows, cols: [{label, kind, title}]; cell(r, c): {shade in [0, 1], weight} or null (no such number);
  // describe(r, c, cell): the sentence for one cell; corner: the table's first header (what a table row is);
  // outside(r, c): the cell is one the row could not see (a sliding window's past), drawn striped.
  draw({ rows, cols, cell, describe, corner, outside = null }) {
    this.spec = { rows, cols, cell, describe };
    const width = (this.scroll.clientWidth || FALLBACK_WIDTH) - (this.rowLabels.offsetWidth || 96);
    const colW = Math.max(MIN_COL, Math.min(MAX_COL, Math.floor(width / Math.max(1, cols.length))));
    this.colW = colW;
    this.canvas.width = cols.length * colW;
    this.canvas.height = rows.length * ROW_H;
    this.canvas.style.width = `${this.canvas.width}px`;
    this.canvas.style.height = `${this.canvas.height}px`;
    const ctx = this.canvas.getContext("2d");
    ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
    const numbers = cols.map((c) => [c.title ?? c.label]);
    for (let r = 0; r < rows.length; r++) {
      for (let c = 0; c < cols.length; c++) {
        const value = cell(r, c);
        numbers[c].push(value?.weight ?? null);
        ctx.fillStyle = value ? shadeColour(value.shade) : "#334155";
        ctx.fillRect(c * colW, r * ROW_H, colW - 1, ROW_H - 1);
        if (!value && outside?.(r, c)) stripe(ctx, c * colW, r * ROW_H, colW - 1, ROW_H - 1);
      }
    }
    this.rowLabels.replaceChildren(...rows.map((r) => label(r, "hm-row", `height:${ROW_H}px`)));
    this.colLabels.replaceChildren(...cols.map((c) => label(c, "hm-col", `width:${colW}px`)));
    this.table.update([corner, ...rows.map((r) => r.title ?? r.label)], numbers);
    if (this.cursor) this.show(this.cursor);
  }

  point(event) {
    const box = this.canvas.getBoundingClientRect();
    const c = Math.floor((event.clientX - box.left) / this.colW);
    const r = Math.floor((event.clientY - box.top) / ROW_H);
    return this.show([r, c]);
  }

  key(event) {
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1], Home: [0, -Infinity], End: [0, Infinity] };
    if (event.key === "Enter") this.pick();
    else if (event.key in moves) {
      const [r, c] = this.cursor ?? [0, 0];
      const [dr, dc] = moves[event.key];
      this.show([r + dr, c + dc]);
    } else return;
    event.preventDefault();
  }

  pick() {
    if (this.cursor && this.onPick) this.onPick(...this.cursor);
  }

  // Puts the cursor on a cell (clamped to the map), lights its row and column labels and describes it.
  show([r, c]) {
    if (!this.spec || !this.spec.rows.length || !this.spec.cols.length) return false;
    const { rows, cols, cell, describe } = this.spec;
    r = Math.max(0, Math.min(rows.length - 1, r));
    c = Math.max(0, Math.min(cols.length - 1, c));
    this.cursor = [r, c];
    for (const hot of this.figure.querySelectorAll(".hot")) hot.classList.remove("hot");
    this.rowLabels.children[r]?.classList.add("hot");
    this.colLabels.children[c]?.classList.add("hot");
    Object.assign(this.marker.style, { left: `${c * this.colW}px`, top: `${r * ROW_H}px`, width: `${this.colW}px`, height: `${ROW_H}px` });
    this.marker.hidden = false;
    this.tip.textContent = describe(r, c, cell(r, c));
    return true;
  }
}

// Diagonal stripes over a cell: a position outside the row's window.
function stripe(ctx, x, y, w, h) {
  ctx.save();
  ctx.beginPath();
  ctx.rect(x, y, w, h);
  ctx.clip();
  ctx.strokeStyle = "#94a3b8";
  ctx.lineWidth = 2;
  for (let d = -h; d < w; d += 6) {
    ctx.moveTo(x + d, y + h);
    ctx.lineTo(x + d + h, y);
  }
  ctx.stroke();
  ctx.restore();
}

function label({ label: text, kind, title }, cls, style) {
  return el("span", { class: `${cls}${kind ? ` seg-${kind}` : ""}`, style, title: title ?? text }, text);
}
