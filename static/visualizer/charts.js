// Plots, drawn with uPlot (static/vendor/uplot-1.6.32).
import uPlot from "../vendor/uplot-1.6.32/uPlot.esm.js";
import { NumbersTable } from "./numbers_table.js";

// A line plot that fills its box; it resizes only when the box changed, as a ResizeObserver reports (reading the
// width on every update would force a layout each time).
// Its numbers are also a table behind a toggle under the plot, for screen readers and for copying.
class LinePlot {
  // yAxes: a label for the one y axis, or a list of {scale, label, side} for series on scales of their own;
  // scales: uPlot scale options beside the x axis's (bars need room at both ends and a zero baseline).
  constructor(node, height, xLabel, yAxes, series, scales = {}, hooks = {}) {
    this.node = node;
    this.height = height;
    const ys = typeof yAxes === "string" ? [{ label: yAxes }] : yAxes;
    this.plot = new uPlot(
      // The legend names the series without waiting for a hover (uPlot's live legend reads "--" until then); the
      // values are in the table under the plot.
      { width: this.width(), height, legend: { live: false }, scales: { x: { time: false }, ...scales }, axes: [{ label: xLabel }, ...ys], series: [{}, ...series], hooks },
      [[], ...series.map(() => [])],
      node,
    );
    this.boxWidth = this.width();
    new ResizeObserver(([entry]) => {
      this.boxWidth = Math.max(240, entry.contentRect.width || 320);
    }).observe(node);
    this.headers = [xLabel, ...series.map((s) => s.label)];
    this.table = new NumbersTable(`${this.headers.slice(1).join(", ")} by ${xLabel}`);
    node.after(this.table.element);
  }

  width() {
    return Math.max(240, this.node.clientWidth || 320);
  }

  set(data) {
    const w = this.boxWidth;
    if (this.plot.width !== w) this.plot.setSize({ width: w, height: this.height });
    this.plot.setData(data);
    this.table.update(this.headers, data[0].map((x, i) => [x, ...data.slice(1).map((ys) => ys[i])]));
  }
}

// On the ITL chart: a dashed line at each gap that held a reader's pause (left out of its value), with its length.
function markPauses(u, pauses) {
  const { ctx, bbox } = u;
  ctx.save();
  ctx.strokeStyle = "#b45309";
  ctx.fillStyle = "#b45309";
  ctx.setLineDash([4, 3]);
  ctx.textAlign = "left";
  ctx.textBaseline = "bottom";
  ctx.font = `${Math.round(11 * devicePixelRatio)}px system-ui, sans-serif`;
  for (const [token, ms] of pauses) {
    const x = Math.round(u.valToPos(token, "x", true));
    ctx.beginPath();
    ctx.moveTo(x, bbox.top);
    ctx.lineTo(x, bbox.top + bbox.height);
    ctx.stroke();
    ctx.fillText(`paused ${(ms / 1000).toFixed(1)} s`, x + 4 * devicePixelRatio, bbox.top + bbox.height - 6 * devicePixelRatio);
  }
  ctx.restore();
}

export class ItlChart extends LinePlot {
  constructor(node) {
    const marks = { pauses: [] }; // the hook below may run while the plot is built, before `this` exists
    super(node, 170, "token", [{ label: "ms", space: 18 }], [ // ticks close enough that a short plot still has several
      { label: "browser", stroke: "#2563eb", points: { show: true } },
      { label: "server", stroke: "#db2777", points: { show: true } },
    ], { y: { range: (u, min, max) => [0, Math.max(max * 1.1, 1)] } }, { draw: [(u) => markPauses(u, marks.pauses)] }); // from zero
    this.marks = marks;
  }

  // pauses: [token, ms] for the gaps before those tokens that held a reader's pause.
  update(clientItls, serverItls, pauses = []) {
    this.marks.pauses = pauses;
    const n = Math.max(clientItls.length, serverItls.length);
    const xs = Array.from({ length: n }, (_, i) => i + 2);
    const pad = (arr) => xs.map((_, i) => (i < arr.length ? arr[i] : null));
    this.set([xs, pad(clientItls), pad(serverItls)]);
  }
}

export class NormChart extends LinePlot {
  constructor(node) {
    super(node, 140, "layer", "‖h‖", [{ label: "norm", stroke: "#059669", points: { show: true } }]);
  }

  update(norms) {
    this.set([norms.map((_, i) => i), norms]);
  }
}

// One point per forward this request took part in: how many sequences shared it, and what it cost.
export class StepChart extends LinePlot {
  constructor(node) {
    super(node, 150, "engine step", [{ scale: "n", label: "sequences" }, { scale: "ms", label: "ms", side: 1, grid: { show: false } }], [
      { label: "batch size", stroke: "#7c3aed", points: { show: true }, scale: "n" },
      { label: "step ms", stroke: "#ea580c", points: { show: true }, scale: "ms" },
    ]);
  }

  update(batches) {
    this.set([batches.map((b) => b.step), batches.map((b) => b.batch_size), batches.map((b) => b.duration * 1000)]);
  }
}

// A layer is two updates of the residual stream, h → h + attention(h) → … + feed-forward(…): per layer, a bar pair
// with the size (L2 norm) of each update.
export class HalvesChart extends LinePlot {
  constructor(node) {
    const bars = (align) => uPlot.paths.bars({ size: [0.42, 28], align });
    super(node, 150, "layer", "‖update‖", [
      { label: "attention ‖Δh‖", stroke: "#2563eb", fill: "#2563ebaa", paths: bars(-1), points: { show: false } },
      { label: "feed-forward ‖Δh‖", stroke: "#ea580c", fill: "#ea580caa", paths: bars(1), points: { show: false } },
    ], {
      x: { time: false, range: (u, min, max) => [min - 0.6, max + 0.6] },
      y: { range: (u, min, max) => [0, max * 1.05 || 1] },
    });
  }

  update(attention, feedForward) {
    this.set([attention.map((_, i) => i), attention, feedForward]);
  }
}
