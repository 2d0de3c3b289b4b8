// The model card beside the model picker: what the chosen model is, in its file's own numbers (from /health, which
// the worker fills once the model is loaded), and the mode a turn is sent in: chat, or "complete this text" (the raw
// text, no chat template), which a base model without a chat template is made for and gets by default. A model served
// by an upstream server has no file here: its card names the servers, and step mode (with the tour, which runs in it)
// is off for it, since only this server's engine waits between tokens.
import { el } from "./dom.js";

const number = (n) => n.toLocaleString("en-US");

export class ModelCard {
  constructor(box, picker, mode, prompt) {
    this.box = box;
    this.picker = picker;
    this.mode = mode;
    this.prompt = prompt;
    this.cards = {};
    this.servers = {}; // upstream model id -> its servers as /health saw them
    picker.addEventListener("change", () => this.show(true));
    mode.addEventListener("change", () => this.placeholder());
  }

  // The cards of every ready model, from /health; called until each is ready.
  async refresh() {
    try {
      const health = await (await fetch("/health")).json();
      for (const [id, s] of Object.entries(health.models ?? {})) {
        if (s.card) this.cards[id] = s.card;
        if (s.upstream) this.servers[id] = s.upstream;
      }
    } catch {
      return;
    }
    this.show(!this.shown);
  }

  // The chosen model's card; `pickMode`: set the mode it is made for (a new pick, or the first card seen).
  show(pickMode) {
    const servers = this.servers[this.picker.value];
    this.offerSteps(!servers);
    if (servers) {
      this.showUpstream(servers, pickMode);
      return;
    }
    const card = this.cards[this.picker.value];
    if (!card) {
      this.box.replaceChildren(el("p", { class: "muted" }, "The model's card appears once it is loaded."));
      return;
    }
    this.shown = true;
    if (pickMode) this.mode.value = card.chat_template ? "chat" : "complete";
    this.placeholder();
    const local = card.layer_windows.filter((w) => w > 0).length;
    const layers = el("div", { class: "layer-cells", role: "img", "aria-label": `${card.layers} layers: ${local} local, ${card.layers - local} global` });
    card.layer_windows.forEach((w, i) => {
      const text = w ? `layer ${i}: local attention, sees the last ${number(w)} tokens` : `layer ${i}: global attention, sees every earlier token`;
      layers.append(el("span", { class: w ? "layer-cell local" : "layer-cell", title: text }));
    });
    this.box.replaceChildren(
      el("p", {}, `${card.name || card.architecture} · ${card.architecture} architecture`),
      el(
        "p",
        { class: "muted" },
        `${card.layers} layers, width ${number(card.width)}, feed-forward ${number(card.feed_forward)}, heads of ${card.head_size}; ` +
          `vocabulary ${number(card.vocabulary)} (${card.tokenizer}), context ${number(card.context)} tokens. ` +
          (card.chat_template ? "Its file has a chat template." : "No chat template in its file: a base model, made to continue text."),
      ),
      el("ul", { class: "features" }, ...[]),
      layers,
    );
    const list = this.box.querySelector(".features");
    for (const feature of card.features) list.append(el("li", {}, feature));
  }

  showUpstream(servers, pickMode) {
    this.shown = true;
    if (pickMode) this.mode.value = "chat";
    this.placeholder();
    const names = servers.map((s) => `${s.name} (${s.model}, ${s.state})`).join(", ");
    this.box.replaceChildren(
      el("p", {}, `served by ${servers.length === 1 ? "an upstream server" : `${servers.length} upstream servers`}: ${names}`),
      el("p", { class: "muted" }, "Its weights, layers and tokenizer live upstream: the pipeline draws what its API returns (text, log-probabilities, usage) " +
        "and its forward pass as a closed box. Step mode and the guided tour are off for it."),
    );
  }

  // Step mode, and the guided tour that runs in it, where this server's engine can wait between tokens.
  offerSteps(offered) {
    const step = document.querySelector('input[name="speed"][value="step"]');
    if (step.disabled === !offered) return;
    step.disabled = !offered;
    document.getElementById("tour-start").disabled = !offered;
    step.parentElement.title = offered ? "" : "An upstream server streams on its own: it cannot wait for “next”.";
    if (!offered && step.checked) {
      const live = document.querySelector('input[name="speed"][value="live"]');
      live.checked = true;
      live.dispatchEvent(new Event("change"));
    }
  }

  // The composer says what the mode does; a text to complete has no system prompt, so its field rests meanwhile.
  placeholder() {
    const complete = this.mode.value === "complete";
    this.prompt.placeholder = complete ? "Write the start of a text; the model continues it…" : "Ask something and watch it travel…";
    const system = document.getElementById("system");
    if (system) {
      system.disabled = complete;
      system.title = complete ? "Not used when completing text: the text goes in as it is." : "";
    }
  }
}
