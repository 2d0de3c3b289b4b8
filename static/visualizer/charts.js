// Plots, drawn with uPlot (static/vendor/uplot-1.6.32).
import uPlot from "../vendor/uplot-1.6.32/uPlot.esm.js";

function width(node) {
  return Math.max(240, node.clientWidth || 320);
}

// Resize only when the box changed: a resize every token would re-layout the page.
function fit(plot, node, height) {
  const w = width(node);
  if (plot.width !== w) plot.setSize({ width: w, height });
}

export class ItlChart {
  constructor(node) {
    this.node = node;
    this.plot = new uPlot(
      {
        width: width(node),
        height: 150,
        scales: { x: { time: false } },
        axes: [{ label: "token" }, { label: "ms" }],
        series: [{}, { label: "browser", stroke: "#2563eb", points: { show: true } }, { label: "server", stroke: "#db2777", points: { show: true } }],
      },
      [[], [], []],
      node,
    );
  }

  update(clientItls, serverItls) {
    const n = Math.max(clientItls.length, serverItls.length);
    const xs = Array.from({ length: n }, (_, i) => i + 2);
    const pad = (arr) => xs.map((_, i) => (i < arr.length ? arr[i] : null));
    fit(this.plot, this.node, 150);
    this.plot.setData([xs, pad(clientItls), pad(serverItls)]);
  }
}

export class NormChart {
  constructor(node) {
    this.node = node;
    this.plot = new uPlot(
      {
        width: width(node),
        height: 140,
        scales: { x: { time: false } },
        axes: [{ label: "layer" }, { label: "‖h‖" }],
        series: [{}, { label: "norm", stroke: "#059669", points: { show: true } }],
      },
      [[], []],
      node,
    );
  }

  update(norms) {
    fit(this.plot, this.node, 140);
    this.plot.setData([norms.map((_, i) => i), norms]);
  }
}
