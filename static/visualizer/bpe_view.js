// How byte-level BPE built a word's tokens, from the model's own merge table: the word's bytes, then each merge in
// the order the tokenizer applies it (best rank first), down to the tokens and their ids. The worker answers
// ("merges" over the page's socket, as a "roundtrip:ask" document event); the answer comes back as "roundtrip:merges".
import { el, field, visible } from "./dom.js";

export class BpeView {
  constructor() {
    this.word = field("tokens", "bpe-word");
    this.steps = field("tokens", "bpe-steps");
    this.model = null;
    field("tokens", "bpe-go").onclick = () => this.ask();
    this.word.onkeydown = (event) => {
      if (event.key === "Enter") {
        event.preventDefault();
        this.ask();
      }
    };
    document.addEventListener("roundtrip:merges", (event) => this.show(event.detail));
  }

  // A new run: its model answers, and the longest token of the message is offered (with its leading space).
  update(run, message) {
    this.model = run.request.model;
    const longest = run.tokenized.tokens.slice(message.token_start, message.token_end).reduce((a, b) => (b.length > a.length ? b : a), "");
    this.word.value = longest;
  }

  ask() {
    if (!this.word.value || !this.model) return;
    this.steps.replaceChildren(el("li", { class: "muted" }, "asking the tokenizer…"));
    document.dispatchEvent(new CustomEvent("roundtrip:ask", { detail: { type: "merges", model: this.model, text: this.word.value } }));
  }

  show(frame) {
    if (frame.type === "error") {
      this.steps.replaceChildren(el("li", { class: "error" }, frame.message));
      return;
    }
    const symbols = (list) => list.map((s) => el("span", { class: "bpe-symbol" }, visible(s)));
    // SentencePiece (Gemma) merges characters by the merged piece's score, spaces written "▁"; byte-level BPE merges
    // bytes by rank in its table
    const sentencepiece = frame.tokenizer === "SentencePiece";
    const rows = [];
    for (const piece of frame.pieces) {
      const unit = sentencepiece ? "characters" : "bytes";
      const start = el("li", { class: "bpe-start" }, `“${visible(piece.text)}” starts as its ${piece.start.length} ${unit}: `);
      start.append(...symbols(piece.start));
      rows.push(start);
      for (const merge of piece.merges) {
        const label = sentencepiece ? `best-scored pair (piece ${merge.rank})` : `merge ${merge.rank.toLocaleString()}`;
        const row = el("li", {}, `${label}: ${visible(merge.pair[0])} + ${visible(merge.pair[1])} → `);
        row.append(...symbols(merge.symbols));
        rows.push(row);
      }
      const end = sentencepiece ? "no two neighbours join into a piece of the vocabulary (a character none covers goes as its bytes)" : "no merge in the table joins what is left";
      rows.push(el("li", { class: "bpe-end", "data-ids": piece.ids.join(",") },
        `${end}: ${piece.ids.length} token${piece.ids.length === 1 ? "" : "s"}, id${piece.ids.length === 1 ? "" : "s"} ${piece.ids.join(", ")}`));
    }
    this.steps.replaceChildren(...rows);
  }
}
