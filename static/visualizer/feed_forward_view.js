// The feed-forward half of every layer at `full` level, for the query token the attention view shows (or a token's
// recomputed detail): how much each half of each layer changed the residual stream (a bar pair per layer), the chosen
// layer's most active SwiGLU neurons, and the logit lens after each half. Built from the run's forward events only,
// so replay shows it too.
import { el, field } from "./dom.js";
import { positionLabel, queryPosition } from "./attention.js";
import { HalvesChart } from "./charts.js";
import { lensTable } from "./logit_lens.js";

const num = (x) => x.toFixed(Math.abs(x) < 10 ? 3 : 1);

export class FeedForwardView {
  // nodes {halves, text, neurons, lens}: where to draw; by default the forward stage's own fields.
  constructor(nodes = { halves: field("forward", "halves"), text: field("forward", "halves-text"), neurons: field("forward", "neurons"), lens: field("forward", "lens") }) {
    this.nodes = nodes;
    this.chart = new HalvesChart(nodes.halves);
  }

  draw(run, forward, layer) {
    const d = forward.detail;
    this.nodes.lens.replaceChildren(lensTable(d, layer));
    if (!d.attention_update_norms) return; // a recording made before the halves were traced
    const query = positionLabel(run, queryPosition(forward));
    this.chart.update(d.attention_update_norms, d.feed_forward_update_norms);
    const attention = d.attention_update_norms[layer];
    const feedForward = d.feed_forward_update_norms[layer];
    this.nodes.text.textContent =
      `“${query.label}” at position ${query.position}, layer ${layer}: the stream arrived with ‖h‖ = ${num(d.residual_norms[layer])}; ` +
      `attention added an update of ‖Δh‖ = ${num(attention)}, the feed-forward half one of ‖Δh‖ = ${num(feedForward)} ` +
      `(${feedForward > attention ? "the feed-forward half changed it more" : "attention changed it more"}).`;
    this.drawNeurons(d.top_neurons[layer], layer);
  }

  drawNeurons(neurons, layer) {
    const largest = Math.max(...neurons.map((n) => Math.abs(n.activation)), 1e-9);
    this.nodes.neurons.replaceChildren(
      ...neurons.map((n) => {
        const item = el("li", { title: `layer ${layer}, neuron ${n.index}` });
        const bar = el("span", { class: `neuron-bar${n.activation < 0 ? " negative" : ""}` });
        bar.append(el("i", { style: `width:${(Math.abs(n.activation) / largest) * 100}%` }));
        item.append(
          el("span", { class: "neuron-id" }, `#${n.index}`),
          bar,
          el("span", { class: "neuron-math" }, `silu(gate) ${num(n.gate)} × up ${num(n.up)} = ${num(n.activation)}`),
        );
        return item;
      }),
    );
  }
}
