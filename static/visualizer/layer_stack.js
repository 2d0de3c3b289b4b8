// The layer stack in the forward stage: one block per layer, each split into its two halves (attention, then
// feed-forward), swept bottom to top as a token goes through. At `full` level each half's shade is the size of the
// update it made to the residual stream, relative to the largest of the pass.
import { el } from "./dom.js";

export function drawLayerStack(node, count, forward) {
  if (node.childElementCount !== count) {
    delete node.dataset.shaded;
    node.replaceChildren(...Array.from({ length: count }, (_, i) => {
      const layer = el("span", { class: "layer", style: `--i:${i}` });
      layer.append(el("i", { class: "half attn" }), el("i", { class: "half ffn" }));
      return layer;
    }));
  }
  const d = forward.detail?.attention_update_norms ? forward.detail : null; // recordings made before the halves were traced have none
  if (d || node.dataset.shaded !== "no") shade(node, d);
  node.classList.toggle("prefill", forward.phase === "prefill");
  sweep(node, forward.step);
}

// At full detail each half's shade is its update's size; without it every half looks the same (drawn once).
function shade(node, d) {
  node.dataset.shaded = d ? "yes" : "no";
  const largest = d ? Math.max(...d.attention_update_norms, ...d.feed_forward_update_norms, 1e-9) : 1;
  [...node.children].forEach((layer, i) => {
    const [attn, ffn] = layer.children;
    layer.title = d
      ? `layer ${i}: attention ‖Δh‖ ${d.attention_update_norms[i].toFixed(3)} · feed-forward ‖Δh‖ ${d.feed_forward_update_norms[i].toFixed(3)}`
      : `layer ${i}: attention, then feed-forward`;
    attn.style.opacity = d ? String(0.15 + 0.85 * (d.attention_update_norms[i] / largest)) : "";
    ffn.style.opacity = d ? String(0.15 + 0.85 * (d.feed_forward_update_norms[i] / largest)) : "";
  });
}

const SWEEP_MS = 800; // a sweep takes about this long; tokens faster than that do not restart it
const SLOW_TOKEN_MS = 300; // tokens further apart than this (slow motion, step mode) each sweep; faster ones do not

// The token going up the stack, layer by layer: for a pass that came after the stack had been still a while (the
// prefill, a step, slow motion). A live answer's tokens follow each other faster than a sweep could show, and an
// animation that never stops redraws the page every frame, on the cores the engine needs: they do not sweep.
// Restarted through the animations themselves (no forced layout).
function sweep(node, step) {
  const now = performance.now();
  if (node.dataset.step === String(step)) return;
  const gap = now - Number(node.dataset.stepAt ?? -Infinity);
  node.dataset.step = String(step);
  node.dataset.stepAt = String(now);
  if (gap < SLOW_TOKEN_MS || now - Number(node.dataset.swept ?? -Infinity) < SWEEP_MS) return;
  node.dataset.swept = String(now);
  if (!node.classList.contains("sweep")) node.classList.add("sweep");
  else for (const animation of node.getAnimations({ subtree: true })) {
    animation.cancel();
    animation.play();
  }
}
