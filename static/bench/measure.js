// One streamed chat completion, timed in the browser: fetch + the response body's reader, performance.now() per chunk.
// TTFT: from just before fetch() to the first chunk that carries text; ITL: between text chunks, per token
// (a chunk with k tokens, by the running usage counts, counts as k gaps of gap / k); E2E: to the end of the stream.
// Every lane goes through this server's gateway, whether its model runs here or on an upstream server, so the browser
// reaches any configured model (no CORS) and the gateway's own time is read from each answer's roundtrip_timings.

export async function streamOnce({ model, prompt, maxTokens, temperature, apiKey, signal }) {
  const headers = { "Content-Type": "application/json" };
  if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
  else headers["X-CSRFToken"] = csrfToken(); // this browser's session, under the session limits
  const body = {
    model, messages: [{ role: "user", content: prompt }], max_tokens: maxTokens, temperature, stream: true,
    stream_options: { include_usage: true, continuous_usage_stats: true },
  };
  const run = { status: 0, error: "", ttft_ms: null, e2e_ms: null, tokens: 0, chunks: [], chunk_tokens: [], text: "",
                server_ttft_ms: null, server_itl_ms: null, gateway_ms: null, gateway_chunk_ms: null, upstream: "",
                request_id: "" };
  const started = performance.now();
  let response;
  try {
    response = await fetch("/v1/chat/completions", { method: "POST", headers, body: JSON.stringify(body), signal, credentials: "same-origin" });
  } catch (err) {
    run.error = `network: ${err.message}`;
    return run;
  }
  run.status = response.status;
  run.request_id = response.headers.get("x-request-id") || "";
  if (!response.ok) {
    const data = await response.json().catch(() => ({}));
    run.error = data.error?.message || `HTTP ${response.status}`;
    return run;
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  let counted = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const now = performance.now() - started;
    buffered += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, cut);
      buffered = buffered.slice(cut + 2);
      if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
      const chunk = JSON.parse(event.slice(6));
      if (chunk.error) {
        run.error = chunk.error.message || "stream error";
        continue;
      }
      const text = chunk.choices?.[0]?.delta?.content;
      if (text) {
        run.chunks.push(now);
        run.text += text;
        const total = chunk.usage?.completion_tokens;
        run.chunk_tokens.push(typeof total === "number" ? Math.max(0, total - counted) : 1);
        if (typeof total === "number") counted = total;
      }
      if (chunk.usage) run.tokens = chunk.usage.completion_tokens;
      if (chunk.roundtrip_timings) {
        run.server_ttft_ms = chunk.roundtrip_timings.ttft_ms ?? null;
        run.server_itl_ms = chunk.roundtrip_timings.mean_itl_ms ?? null;
        // the gateway's own time: its checks (and, for an upstream model, choosing and asking the server), and per
        // chunk passed on from an upstream server
        run.gateway_ms = chunk.roundtrip_timings.gateway_ms ?? null;
        run.gateway_chunk_ms = chunk.roundtrip_timings.gateway_chunk_ms ?? null;
        run.upstream = chunk.roundtrip_timings.upstream ?? "";
      }
    }
  }
  run.e2e_ms = performance.now() - started;
  run.ttft_ms = run.chunks.length ? run.chunks[0] : null;
  if (!run.tokens) run.tokens = run.chunks.length;
  run.itls = itls(run);
  run.mean_itl_ms = run.itls.length ? run.itls.reduce((a, b) => a + b, 0) / run.itls.length : null;
  run.tokens_per_s = run.tokens > 1 && run.ttft_ms !== null ? ((run.tokens - 1) * 1000) / (run.e2e_ms - run.ttft_ms) : null;
  return run;
}

export function itls(run) {
  const gaps = [];
  for (let i = 1; i < run.chunks.length; i++) {
    const k = Math.max(1, run.chunk_tokens[i] || 1);
    const gap = (run.chunks[i] - run.chunks[i - 1]) / k;
    for (let j = 0; j < k; j++) gaps.push(gap);
  }
  return gaps;
}

function csrfToken() {
  return document.cookie.split("; ").find((c) => c.startsWith("csrftoken="))?.split("=")[1] || "";
}
