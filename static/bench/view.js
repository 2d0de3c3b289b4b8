// Draws a benchmark (live or saved): the summary table, the charts (uPlot) and the PNG result card.
import uPlot from "../vendor/uplot-1.6.32/uPlot.esm.js";
import { el } from "../visualizer/dom.js";
import { laneSummary } from "./stats.js";

const COLORS = ["#2563eb", "#ea580c", "#16a34a", "#7c3aed"];
const fmt = (v, digits = 1) => (v === null || v === undefined ? "—" : v.toFixed(digits));

export function drawSummary(table, lanes) {
  const head = el("tr");
  for (const h of ["lane", "ok", "TTFT median / p95 / σ (ms)", "ITL median / p95 / σ (ms)", "tokens/s median", "E2E median (ms)",
    "server TTFT (ms)", "server ITL (ms)", "browser − server TTFT (ms)", "gateway (ms; per chunk)", "served by"]) head.append(el("th", {}, h));
  table.replaceChildren(el("thead"), el("tbody"));
  table.tHead.append(head);
  for (const lane of lanes) {
    const s = laneSummary(lane);
    const row = el("tr", { "data-lane": lane.name });
    const gap = s.ttft.median !== null && s.serverTtft.median !== null ? s.ttft.median - s.serverTtft.median : null;
    const cells = [lane.name, `${s.ok}/${s.total}`, `${fmt(s.ttft.median)} / ${fmt(s.ttft.p95)} / ${fmt(s.ttft.std)}`,
      `${fmt(s.itl.median)} / ${fmt(s.itl.p95)} / ${fmt(s.itl.std)}`, fmt(s.tps.median), fmt(s.e2e.median, 0),
      fmt(s.serverTtft.median), fmt(s.serverItl.median), fmt(gap),
      s.gatewayChunk.median !== null ? `${fmt(s.gateway.median)}; ${fmt(s.gatewayChunk.median, 3)}` : fmt(s.gateway.median),
      s.upstreams.join(", ") || "this server"];
    const names = ["lane", "ok", "ttft", "itl", "tps", "e2e", "server-ttft", "server-itl", "gap", "gateway", "served-by"];
    cells.forEach((c, i) => row.append(el("td", { "data-col": names[i] }, c)));
    table.tBodies[0].append(row);
    if (s.errors.length) table.tBodies[0].append(el("tr", { class: "error" }, `${lane.name}: ${s.errors.length} failed — ${s.errors[0]}`));
  }
}

// A point chart of one value per run, a line per lane.
class PerRun {
  constructor(node, title, yLabel, lanes) {
    this.node = node;
    this.plot = new uPlot({ width: node.clientWidth || 600, height: 180, title, scales: { x: { time: false } },
      axes: [{ label: "run", incrs: [1, 2, 5, 10, 20, 50] }, { label: yLabel }],
      series: [{}, ...lanes.map((l, i) => ({ label: l.name, stroke: COLORS[i % COLORS.length], points: { show: true, size: 6 }, width: 1 }))] },
    [[], ...lanes.map(() => [])], node);
  }

  update(lanes, pick) {
    const n = Math.max(0, ...lanes.map((l) => l.runs.length));
    const x = Array.from({ length: n }, (_, i) => i + 1);
    this.plot.setData([x, ...lanes.map((l) => x.map((_, i) => (l.runs[i] && !l.runs[i].error ? pick(l.runs[i]) : null)))]);
  }
}

// Inter-token latency by token position, for each lane's latest finished run.
class ByPosition {
  constructor(node, lanes) {
    this.plot = new uPlot({ width: node.clientWidth || 600, height: 180, title: "inter-token latency by token (latest run)", scales: { x: { time: false } },
      axes: [{ label: "token", incrs: [1, 2, 5, 10, 20, 50, 100] }, { label: "ms" }],
      series: [{}, ...lanes.map((l, i) => ({ label: l.name, stroke: COLORS[i % COLORS.length] }))] }, [[], ...lanes.map(() => [])], node);
  }

  update(lanes) {
    const latest = lanes.map((l) => [...l.runs].reverse().find((r) => !r.error && r.itls?.length)?.itls || []);
    const n = Math.max(0, ...latest.map((g) => g.length));
    const x = Array.from({ length: n }, (_, i) => i + 1);
    this.plot.setData([x, ...latest.map((g) => x.map((_, i) => g[i] ?? null))]);
  }
}

// The distribution of each lane's TTFTs: sorted values against their quantile.
class Distribution {
  constructor(node, lanes) {
    this.plot = new uPlot({ width: node.clientWidth || 600, height: 180, title: "TTFT distribution", scales: { x: { time: false } },
      axes: [{ label: "quantile" }, { label: "ms" }],
      series: [{}, ...lanes.map((l, i) => ({ label: l.name, stroke: COLORS[i % COLORS.length], points: { show: true } }))] }, [[], ...lanes.map(() => [])], node);
  }

  update(lanes) {
    const sorted = lanes.map((l) => l.runs.filter((r) => !r.error).map((r) => r.ttft_ms).sort((a, b) => a - b));
    const steps = 20;
    const x = Array.from({ length: steps + 1 }, (_, i) => i / steps);
    this.plot.setData([x, ...sorted.map((v) => x.map((q) => (v.length ? v[Math.min(v.length - 1, Math.round(q * (v.length - 1)))] : null)))]);
  }
}

export class Charts {
  constructor(root, lanes) {
    root.replaceChildren();
    const box = (name) => root.appendChild(el("div", { class: "chart", "data-chart": name }));
    this.ttft = new PerRun(box("ttft"), "time to first token", "ms", lanes);
    this.tps = new PerRun(box("tps"), "tokens per second", "tok/s", lanes);
    this.position = new ByPosition(box("position"), lanes);
    this.distribution = new Distribution(box("distribution"), lanes);
  }

  update(lanes) {
    this.ttft.update(lanes, (r) => r.ttft_ms);
    this.tps.update(lanes, (r) => r.tokens_per_s);
    this.position.update(lanes);
    this.distribution.update(lanes);
  }
}

// The scheduler's batch over time during a load run: running, waiting, KV use.
export class StateChart {
  constructor(node) {
    this.t0 = performance.now();
    this.data = [[], [], [], []];
    this.plot = new uPlot({ width: node.clientWidth || 600, height: 160, title: "server: requests in the batch and waiting", scales: { x: { time: false }, kv: { range: [0, 100] } },
      axes: [{ label: "s" }, { label: "requests" }, { scale: "kv", side: 1, label: "KV %", grid: { show: false } }],
      series: [{}, { label: "running", stroke: "#2563eb" }, { label: "waiting", stroke: "#b45309" }, { label: "KV cache %", stroke: "#16a34a", scale: "kv" }] },
    this.data, node);
  }

  add(state) {
    const models = Object.values(state.models || {});
    const sum = (k) => models.reduce((a, m) => a + m[k], 0);
    this.data[0].push((performance.now() - this.t0) / 1000);
    this.data[1].push(sum("running"));
    this.data[2].push(sum("waiting"));
    this.data[3].push(Math.max(0, ...models.map((m) => m.kv_usage)) * 100);
    this.plot.setData(this.data);
  }
}

// A shareable PNG: the title, each lane's headline numbers, drawn on a canvas.
export function resultCard(title, lanes) {
  const canvas = document.createElement("canvas");
  canvas.width = 900;
  canvas.height = 140 + lanes.length * 70;
  const g = canvas.getContext("2d");
  g.fillStyle = "#111827";
  g.fillRect(0, 0, canvas.width, canvas.height);
  g.fillStyle = "#fff";
  g.font = "bold 28px system-ui, sans-serif";
  g.fillText(`Roundtrip benchmark: ${title}`.slice(0, 60), 30, 50);
  g.font = "16px system-ui, sans-serif";
  g.fillStyle = "#9ca3af";
  g.fillText("measured in the browser: time to first token, inter-token latency, tokens/s (median over runs)", 30, 80);
  lanes.forEach((lane, i) => {
    const s = laneSummary(lane);
    const y = 130 + i * 70;
    g.fillStyle = COLORS[i % COLORS.length];
    g.fillRect(30, y - 22, 8, 40);
    g.fillStyle = "#fff";
    g.font = "bold 20px system-ui, sans-serif";
    g.fillText(lane.name.slice(0, 40), 50, y);
    g.font = "18px system-ui, sans-serif";
    g.fillText(`TTFT ${fmt(s.ttft.median)} ms · ITL ${fmt(s.itl.median)} ms · ${fmt(s.tps.median)} tok/s · ${s.ok}/${s.total} runs`, 50, y + 26);
  });
  return canvas;
}

export function download(name, blob) {
  const a = el("a", { href: URL.createObjectURL(blob), download: name });
  document.body.append(a);
  a.click();
  a.remove();
}
