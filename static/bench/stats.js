// Statistics over a lane's runs: median, p95, standard deviation; what the tables and the card show.

export function describe(values) {
  const v = values.filter((x) => x !== null && x !== undefined && Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return { n: 0, median: null, p95: null, std: null, min: null, max: null };
  const at = (q) => v[Math.min(v.length - 1, Math.max(0, Math.ceil(q * v.length) - 1))];
  const mean = v.reduce((a, b) => a + b, 0) / v.length;
  const std = Math.sqrt(v.reduce((a, b) => a + (b - mean) ** 2, 0) / v.length);
  return { n: v.length, median: at(0.5), p95: at(0.95), std, min: v[0], max: v[v.length - 1] };
}

export function laneSummary(lane) {
  const ok = lane.runs.filter((r) => !r.error);
  return {
    name: lane.name,
    ok: ok.length,
    total: lane.runs.length,
    ttft: describe(ok.map((r) => r.ttft_ms)),
    itl: describe(ok.flatMap((r) => r.itls || [])),
    tps: describe(ok.map((r) => r.tokens_per_s)),
    e2e: describe(ok.map((r) => r.e2e_ms)),
    serverTtft: describe(ok.map((r) => r.server_ttft_ms)),
    serverItl: describe(ok.map((r) => r.server_itl_ms)),
    gateway: describe(ok.map((r) => r.gateway_ms)),
    gatewayChunk: describe(ok.map((r) => r.gateway_chunk_ms)),
    upstreams: [...new Set(ok.map((r) => r.upstream).filter(Boolean))],
    errors: lane.runs.filter((r) => r.error).map((r) => r.error),
  };
}
