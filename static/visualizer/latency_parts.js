// Where a run's time went, from its frames: the parts that add up to the time to first token, and the parts of one
// inter-token gap. Shared by the latency stage's waterfall and the guided tour's closing step.

const sum = (values) => values.reduce((a, b) => a + b, 0);

function median(values) {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

// What the gateway's checks (authenticate, rate limit, route) took, in ms.
export function gatewayMs(run) {
  return run.gateway ? sum(run.gateway.stages.map((s) => s.ms)) : 0;
}

// [name, ms] before the first token could be sampled: the gateway's checks, the worker's queue, tokenization, prefill;
// for an upstream model, the gateway's checks, the upstream's tokenizer and its time to first token as seen from here.
export function ttftParts(run) {
  const t = run.finished.timings;
  if (run.upstream) return [["gateway", gatewayMs(run)], ["tokenize", (run.tokenized?.duration ?? 0) * 1000], ["upstream", t.ttft * 1000]];
  return [
    ["gateway", gatewayMs(run)],
    ["queue", (t.queue ?? 0) * 1000],
    ["tokenize", t.tokenize * 1000],
    ["prefill", t.prefill * 1000],
  ];
}

// [name, ms] of the server's whole answer: the parts of the time to first token, then each decode forward (an
// upstream's decode, out of sight, as one part).
export function serverParts(run) {
  const decode = run.upstream ? [["decode", run.finished.timings.decode * 1000]] : run.forwards.filter((f) => f.phase === "decode").map((f) => ["decode", f.duration * 1000]);
  return [...ttftParts(run), ...decode];
}

// One token after the first, as medians in ms: the batched decode forward, sampling, and what the browser measured
// beyond them (network, framing, the page). Pauses the reader made in step mode are not in the gaps (Run.clientItls).
export function itlParts(run) {
  const decode = median(run.forwards.filter((f) => f.phase === "decode").map((f) => f.duration * 1000));
  const sampling = median([...run.steps.values()].filter((s) => s.sampled && s.sampled.step > 1).map((s) => s.sampled.duration * 1000));
  const client = median(run.clientItls);
  if (decode === null || sampling === null || client === null) return null;
  return { decode, sampling, network: Math.max(0, client - decode - sampling), client };
}
