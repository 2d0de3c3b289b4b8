// The pipeline folded to one line: the eight stages with their clocks, live. A stage lights up once the run has
// reached it; a click opens the pipeline there.
import { el } from "./dom.js";
import { clocks, MEANING, STAGES } from "./clocks.js";

export class PipelineStrip {
  constructor(host, open) {
    this.items = {};
    const list = el("ol", { class: "strip-stages" });
    STAGES.forEach(([name, label], i) => {
      const button = el("button", { type: "button", class: "strip-stage", "data-stage": name, title: `${label}: ${MEANING[name]}` });
      const clock = el("span", { class: "strip-clock" });
      button.append(el("span", { class: "n" }, String(i + 1)), el("span", { class: "strip-name" }, label), clock);
      button.addEventListener("click", () => open(name));
      const item = el("li");
      item.append(button);
      list.append(item);
      this.items[name] = { button, clock };
    });
    this.total = el("span", { class: "strip-total", title: `latency: ${MEANING.latency}` });
    host.replaceChildren(list, this.total);
  }

  update(run) {
    const now = clocks(run);
    for (const [name, { button, clock }] of Object.entries(this.items)) {
      if (clock.textContent !== now[name]) clock.textContent = now[name];
      const reached = now[name] !== "";
      if (button.classList.contains("reached") !== reached) button.classList.toggle("reached", reached);
    }
    const total = now.latency ? `total ${now.latency}` : "";
    if (this.total.textContent !== total) this.total.textContent = total;
  }
}
