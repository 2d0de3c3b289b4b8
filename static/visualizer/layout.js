// The page's layout choices: the pipeline open beside the chat or folded to its strip (remembered), and on narrow
// screens the conversations and settings in a drawer behind a button, so the message box is in the first screen.
import { recall, remember } from "./prefs.js";

export class Layout {
  // onOpen(): the pipeline was opened (its stages are drawn only while it is).
  constructor({ onOpen }) {
    this.toggle = document.getElementById("pipeline-toggle");
    this.pipeline = document.getElementById("pipeline");
    this.onOpen = onOpen;
    this.toggle.addEventListener("click", () => this.setOpen(!this.open));
    this.setOpen(recall("pipeline") === "open", false);
    const drawer = document.getElementById("sidebar-toggle");
    drawer.addEventListener("click", () => this.setDrawer(!document.body.classList.contains("drawer-open")));
    document.getElementById("sidebar-close").addEventListener("click", () => this.setDrawer(false));
    // The forward pass's "More" parts stay as the visitor left them (the plain view is what a first visit sees).
    for (const more of document.querySelectorAll("details[data-more]")) {
      const name = `more.${more.dataset.more}`;
      more.open = recall(name) === "open";
      more.addEventListener("toggle", () => remember(name, more.open ? "open" : "closed"));
    }
  }

  get open() {
    return document.body.classList.contains("pipeline-open");
  }

  setOpen(open, save = true) {
    document.body.classList.toggle("pipeline-open", open);
    this.pipeline.hidden = !open;
    this.toggle.setAttribute("aria-expanded", String(open));
    this.toggle.textContent = open ? "Fold the pipeline" : "Open the pipeline";
    if (save) remember("pipeline", open ? "open" : "folded");
    if (open) this.onOpen();
  }

  // Open the pipeline at one stage (a click on the strip, the guided tour).
  reveal(stage) {
    if (!this.open) this.setOpen(true);
    document.getElementById(`stage-${stage}`)?.scrollIntoView({ block: "start" });
  }

  setDrawer(open) {
    document.body.classList.toggle("drawer-open", open);
    document.getElementById("sidebar-toggle").setAttribute("aria-expanded", String(open));
  }
}
