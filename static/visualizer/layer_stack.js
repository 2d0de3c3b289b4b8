// The layer stack in the forward stage: one block per layer, each split into its two halves (attention, then
// feed-forward), swept bottom to top as a token goes through. At `full` level each half's shade is the size of the
// update it made to the residual stream, relative to the largest of the pass.
import { el } from "./dom.js";

export function drawLayerStack(node, count, forward) {
  if (node.childElementCount !== count) {
    node.replaceChildren(...Array.from({ length: count }, (_, i) => {
      const layer = el("span", { class: "layer", style: `--i:${i}` });
      layer.append(el("i", { class: "half attn" }), el("i", { class: "half ffn" }));
      return layer;
    }));
  }
  const d = forward.detail?.attention_update_norms ? forward.detail : null; // recordings made before the halves were traced have none
  const largest = d ? Math.max(...d.attention_update_norms, ...d.feed_forward_update_norms, 1e-9) : 1;
  [...node.children].forEach((layer, i) => {
    const [attn, ffn] = layer.children;
    layer.title = d
      ? `layer ${i}: attention ‖Δh‖ ${d.attention_update_norms[i].toFixed(3)} · feed-forward ‖Δh‖ ${d.feed_forward_update_norms[i].toFixed(3)}`
      : `layer ${i}: attention, then feed-forward`;
    attn.style.opacity = d ? String(0.15 + 0.85 * (d.attention_update_norms[i] / largest)) : "";
    ffn.style.opacity = d ? String(0.15 + 0.85 * (d.feed_forward_update_norms[i] / largest)) : "";
  });
  node.classList.toggle("prefill", forward.phase === "prefill");
  node.classList.remove("sweep");
  void node.offsetWidth; // restart the sweep
  node.classList.add("sweep");
}
