// "Copy ids": a list of token ids onto the clipboard, and into a visible text field as well, since the clipboard
// may be refused (no permission, an insecure origin) and the ids should be at hand either way.
import { el } from "./dom.js";

export function copyIdsButton(ids) {
  const text = `[${ids.join(", ")}]`;
  const box = el("span", { class: "copy-ids" });
  const button = el("button", { type: "button", class: "copy-ids-button" }, "copy ids");
  const output = el("input", { type: "text", readOnly: true, class: "copy-ids-text", value: text, hidden: true });
  output.setAttribute("aria-label", "token ids");
  button.addEventListener("click", async () => {
    output.hidden = false;
    output.select();
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = "ids copied";
    } catch {
      button.textContent = "select and copy the ids";
    }
  });
  box.append(button, output);
  return box;
}
