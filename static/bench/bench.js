// The benchmark page: lanes (model and settings side by side), runs at a concurrency, live charts, save and share.
import { el } from "../visualizer/dom.js";
import { streamOnce } from "./measure.js";
import { Charts, StateChart, download, drawSummary, resultCard } from "./view.js";

const $ = (id) => document.getElementById(id);
const presets = JSON.parse($("presets").textContent);
let current = null; // {title, settings, lanes} of the latest run
let aborter = null;

$("preset").addEventListener("change", () => { if (presets[$("preset").value]) $("prompt").value = presets[$("preset").value]; });
$("api-key").value = sessionStorage.getItem("bench-api-key") || "";
$("api-key").addEventListener("change", () => sessionStorage.setItem("bench-api-key", $("api-key").value.trim()));
$("add-lane").addEventListener("click", () => {
  const lanes = document.querySelectorAll(".lane");
  if (lanes.length < 4) $("lanes").append(lanes[lanes.length - 1].cloneNode(true));
});

function settings() {
  const lanes = [...document.querySelectorAll(".lane")].map((node, i) => {
    const model = node.querySelector('[name="model"]').value;
    const temperature = Number(node.querySelector('[name="temperature"]').value);
    const maxTokens = Number(node.querySelector('[name="max_tokens"]').value);
    return { name: `${i + 1}. ${model} t=${temperature} max=${maxTokens}`, model, temperature, maxTokens };
  });
  return { lanes, prompt: $("prompt").value, runs: Math.min(100, Math.max(1, Number($("runs").value))),
           concurrency: Math.min(16, Math.max(1, Number($("concurrency").value))) };
}

async function runLane(setup, lane, apiKey, onRun) {
  let next = 0;
  const worker = async () => {
    while (next < setup.runs && !aborter.signal.aborted) {
      next += 1;
      const run = await streamOnce({ model: lane.model, prompt: setup.prompt, maxTokens: lane.maxTokens, temperature: lane.temperature, apiKey, signal: aborter.signal });
      delete run.text; // the numbers are kept, not the answers
      lane.runs.push(run);
      onRun();
    }
  };
  await Promise.all(Array.from({ length: setup.concurrency }, worker));
}

$("run").addEventListener("click", async () => {
  const setup = settings();
  const apiKey = $("api-key").value.trim();
  const lanes = setup.lanes.map((l) => ({ ...l, runs: [] }));
  current = { title: $("title").value || setup.prompt.slice(0, 60), settings: { ...setup, lanes: setup.lanes }, lanes };
  aborter = new AbortController();
  $("run").disabled = true;
  $("stop").disabled = false;
  $("save").disabled = true;
  $("share").replaceChildren();
  const charts = new Charts($("charts"), lanes);
  const state = new StateChart($("state"));
  const poll = setInterval(async () => state.add(await (await fetch("/bench/state")).json()), 500);
  const total = lanes.length * setup.runs;
  const redraw = () => {
    const done = lanes.reduce((a, l) => a + l.runs.length, 0);
    $("progress").value = done / total;
    $("progress-text").textContent = `${done} of ${total} requests`;
    drawSummary($("summary"), lanes);
    charts.update(lanes);
  };
  try {
    for (const lane of lanes) await runLane(setup, lane, apiKey, redraw); // lanes one after another: no lane slows another
  } finally {
    clearInterval(poll);
    $("run").disabled = false;
    $("stop").disabled = true;
    $("save").disabled = false;
    $("progress-text").textContent += aborter.signal.aborted ? " (stopped)" : " — done";
  }
});

$("stop").addEventListener("click", () => aborter?.abort());

$("save").addEventListener("click", async () => {
  const token = document.cookie.split("; ").find((c) => c.startsWith("csrftoken="))?.split("=")[1] || "";
  const response = await fetch("/bench/results/new", { method: "POST", headers: { "Content-Type": "application/json", "X-CSRFToken": token },
                                                        body: JSON.stringify(current), credentials: "same-origin" });
  const data = await response.json();
  if (!response.ok) {
    $("share").replaceChildren(el("span", { class: "error" }, data.error?.message || `could not save (HTTP ${response.status})`));
    return;
  }
  $("share").replaceChildren("Saved: ", el("a", { href: data.url, "data-field": "permalink" }, data.url));
  document.body.dispatchEvent(new Event("bench-saved"));
});

$("export-json").addEventListener("click", () => current && download("bench.json", new Blob([JSON.stringify(current, null, 1)], { type: "application/json" })));
$("export-csv").addEventListener("click", () => {
  if (!current) return;
  const cols = ["status", "error", "ttft_ms", "e2e_ms", "tokens", "tokens_per_s", "mean_itl_ms", "server_ttft_ms", "server_itl_ms", "gateway_ms", "gateway_chunk_ms", "upstream", "request_id"];
  // a text cell a spreadsheet would run as a formula (=, +, -, @, tab, CR first) gains a leading apostrophe
  const safe = (v) => (typeof v === "string" && /^[=+\-@\t\r]/.test(v) ? `'${v}` : v);
  const quote = (v) => `"${String(safe(v) ?? "").replace(/"/g, '""')}"`;
  const lines = [["lane", "run", ...cols].join(",")];
  for (const lane of current.lanes) lane.runs.forEach((r, i) => lines.push([quote(lane.name), i + 1, ...cols.map((c) => quote(r[c]))].join(",")));
  download("bench.csv", new Blob([lines.join("\n")], { type: "text/csv" }));
});
$("card").addEventListener("click", () => current && resultCard(current.title, current.lanes).toBlob((blob) => download("bench-card.png", blob)));
