// Each stage's clock, from the run's frames only: the pipeline strip and the stage headers show the same numbers.
import { ms } from "./dom.js";
import { gatewayMs } from "./latency_parts.js";

// The eight stages of a request's trip, in order, with the names the strip shows.
export const STAGES = [
  ["request", "Request"],
  ["gateway", "Gateway"],
  ["tokens", "Tokenize"],
  ["context", "Context"],
  ["forward", "Forward"],
  ["sampling", "Sample"],
  ["stream", "Stream"],
  ["detok", "Detokenize"],
];

// What each clock means, for its tooltip.
export const MEANING = {
  request: "the request's JSON reaching the server and its echo coming back (round trip)",
  gateway: "the gateway's checks: authenticate, rate limit, route",
  tokens: "tokenizing the prompt",
  context: "building the context window (chat template, history that fits)",
  forward: "the latest forward pass through every layer",
  sampling: "choosing the latest token",
  stream: "the latest gap between tokens arriving here, per token (tokens that came in one bundle share it; the first: time to first token)",
  detok: "from the latest token's choice to its text being released",
  latency: "from pressing Send to the latest token on screen",
};

// {stage: text} for every stage the run has reached; "" where it has not.
export function clocks(run) {
  const out = Object.fromEntries([...STAGES.map(([name]) => [name, ""]), ["latency", ""]]);
  const echo = run.frames.find(({ frame }) => frame.type === "request");
  if (echo && !run.replay) out.request = ms(echo.at);
  if (run.gateway) out.gateway = ms(gatewayMs(run));
  if (run.tokenized) out.tokens = ms(run.tokenized.duration * 1000);
  if (run.context && run.tokenized) out.context = ms(Math.max(0, run.context.t - run.tokenized.t) * 1000);
  if (run.lastForward) out.forward = ms(run.lastForward.duration * 1000);
  const sampled = run.lastSampled;
  if (sampled) out.sampling = ms(sampled.duration * 1000);
  const arrivals = run.tokenArrivals;
  const latest = arrivals.length - 1;
  let first = latest; // the first token of the latest bundle (tokens the page received together)
  while (first > 0 && arrivals[first - 1] === arrivals[latest]) first--;
  if (first > 0) out.stream = ms((arrivals[latest] - arrivals[first - 1]) / (latest - first + 1));
  else if (arrivals.length && run.sentAt !== null) out.stream = ms(arrivals[0] - run.sentAt);
  const text = run.lastText;
  const chosen = text ? run.steps.get(text.step)?.sampled : null;
  if (text && chosen) out.detok = ms(Math.max(0, text.t - chosen.t) * 1000);
  if (arrivals.length && run.sentAt !== null) out.latency = ms(arrivals[arrivals.length - 1] - run.sentAt);
  // an upstream model's context, forward passes, sampling and detokenization ran inside the other server: reached, unclocked
  if (run.upstream) for (const stage of ["context", "forward", "sampling", "detok"]) out[stage] = run.steps.size ? "—" : "";
  return out;
}
