// The tokens of a run by position: the prompt's from the tokenized event, the answer's from the sampled events,
// each with the context segment it sits in. Every view that names a position (chips, heatmap labels, the head
// view, the loop strip) asks here, so a position reads and is coloured the same way everywhere.
import { el, visible } from "./dom.js";

export const SEGMENT_LABELS = { system: "system prompt", history: "earlier turns", message: "your message", markup: "template markup", answer: "the answer" };

// {position, id, text, kind} for a position of this run, or null when the trace has not said yet.
export function tokenAt(run, position) {
  const prompt = run?.tokenized;
  if (!prompt) return null;
  if (position < prompt.ids.length) {
    const segment = run.context?.segments.find((s) => position >= s.token_start && position < s.token_end);
    // a SentencePiece vocabulary's own pieces say more than their text: "▁capital", a byte-fallback "<0xF0>"
    const piece = prompt.tokenizer === "SentencePiece" ? prompt.pieces?.[position] : undefined;
    return { position, id: prompt.ids[position], text: prompt.tokens[position], kind: segment?.kind ?? "markup", piece };
  }
  const sampled = run.steps.get(position - prompt.ids.length + 1)?.sampled;
  return sampled ? { position, id: sampled.token_id, text: sampled.token, kind: "answer" } : null;
}

// The positions of the visitor's message in the prompt: its context segment; for an upstream model (no context event),
// the tokens whose characters overlap the message where it last occurs in the prompt the upstream rendered; else all.
export function messageRange(run) {
  const ids = run.tokenized.ids;
  const all = { token_start: 0, token_end: ids.length };
  if (run.context) return run.context.segments.find((s) => s.kind === "message") ?? all;
  const asked = run.request.prompt ?? run.request.messages?.findLast((m) => m.role === "user")?.content;
  const at = asked ? run.tokenized.text.lastIndexOf(asked) : -1;
  if (at < 0) return all;
  const start = [...run.tokenized.text.slice(0, at)].length; // spans count characters, not UTF-16 units
  const end = start + [...asked].length;
  const inside = run.tokenized.spans.flatMap(([a, b], i) => (b > start && a < end ? [i] : []));
  return inside.length ? { token_start: inside[0], token_end: inside[inside.length - 1] + 1 } : all;
}

export function isSpecial(text) {
  return text.startsWith("<|") && text.endsWith("|>");
}

// "“·India” (position 19, your message, id 3089)": what a label's tooltip and a screen reader say about a position
// (quoted: a token may be just "." or "↵").
export function describeToken(token) {
  return `“${visible(token.text)}” (position ${token.position}, ${SEGMENT_LABELS[token.kind]}, id ${token.id})`;
}

// A chip whose text, id and (optionally) position are real text: selectable, copyable, read aloud.
export function tokenChip(token, { position = false, colour = `seg-${token.kind}` } = {}) {
  const chip = el("span", { class: `chip ${colour}${isSpecial(token.text) ? " special" : ""}`, "data-id": String(token.id), "data-position": String(token.position) });
  // real spaces between the parts, so that copied or spoken text reads "19 ·India 3089" (the token's own spaces show as ·)
  if (position) chip.append(el("span", { class: "tok-pos", title: "position" }, String(token.position)), " ");
  const text = el("span", { class: "tok-text", title: token.piece ? `the vocabulary's piece for “${visible(token.text)}”` : "" }, token.piece ?? visible(token.text));
  chip.append(text, " ", el("span", { class: "tok-id", title: "token id" }, String(token.id)));
  return chip;
}
