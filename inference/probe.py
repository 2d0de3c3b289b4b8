"""The `full`-level look inside a forward pass, for one token of one sequence.

The model hands this probe the token's residual stream (entering each layer and between
each layer's two halves), its attention inputs and its feed-forward gate and up
projections (its own row only, whoever else is in the batch); the probe computes
attention weights, the size of each half's update, the most active feed-forward neurons
and the logit lens itself, so the model's forward stays the plain computation when no
probe is given.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from inference.trace import LayerDetail, LensGuess, Neuron

# layers whose logit lens is computed while generating, after each half: 12 rows through the 49k-token head
LIVE_LENS_LAYERS = 6
TOP_NEURONS = 8  # feed-forward neurons reported per layer


def lens_layers(n_layers: int, count: int | None = LIVE_LENS_LAYERS) -> list[int]:
    """`count` evenly spaced layers ending with the last (every layer when count is None or covers them)."""
    if count is None or count >= n_layers:
        return list(range(n_layers))
    return sorted({round((k + 1) * n_layers / count) - 1 for k in range(count)})


def attention_weights(q: Tensor, k: Tensor, first: Tensor | None = None) -> Tensor:
    """Attention weights [..., H, S] over every position a token sees, recomputed: q [..., H, hd], k [..., KV, S, hd]
    (the leading dims, such as layers, are batched into one multiply); `first` [...]: the first position each sees
    (a sliding window's), the ones before it get weight 0."""
    n_kv, S, hd = k.shape[-3], k.shape[-2], k.shape[-1]
    grouped = q.float().unflatten(-2, (n_kv, -1))  # [..., KV, group, hd]: the query heads that share each key head
    scores = torch.matmul(grouped, k.float().transpose(-1, -2)).flatten(-3, -2) / math.sqrt(hd)  # [..., H, S]
    if first is not None:
        hidden = torch.arange(S) < first.unsqueeze(-1)  # [..., S]
        scores = scores.masked_fill(hidden.unsqueeze(-2), float("-inf"))
    return torch.softmax(scores, dim=-1)


class PromptMatrixProbe:
    """One layer's attention for every position of a recomputed prompt: weights [H, T, T], row i = position i's
    query over positions 0..i (zeros after). Registered for every token of the pass; it ignores the rest."""

    def __init__(self, layer: int, n_heads: int, length: int) -> None:
        self.layer = layer
        self.weights = torch.zeros(n_heads, length, length)

    def on_residual(self, layer: int, h: Tensor) -> None:
        pass

    def on_mid_residual(self, layer: int, h: Tensor) -> None:
        pass

    def on_feed_forward(self, layer: int, gate: Tensor, up: Tensor) -> None:
        pass

    def lens_streams(self) -> Tensor | None:
        return None

    def on_lens(self, logits: Tensor) -> None:
        pass

    def on_attention(self, layer: int, q: Tensor, k: Tensor, first: int) -> None:
        if layer == self.layer:
            seen = k.shape[1]  # the query's own position + 1
            self.weights[:, seen - 1, :seen] = attention_weights(q, k, torch.tensor(first))


class LayerProbe:
    """`lens`: the layers whose logit-lens guess to compute (default: `lens_layers`)."""

    def __init__(self, lens: list[int] | None = None) -> None:
        self.lens = lens
        self._residuals: list[Tensor] = []
        self._mid: list[Tensor] = []
        self._queries: list[Tensor] = []
        self._keys: list[Tensor] = []
        self._firsts: list[int] = []
        self._gates: list[Tensor] = []
        self._ups: list[Tensor] = []
        self._lens_layers: list[int] = []
        self._lens_logits: Tensor | None = None  # [2 * lens layers, V], handed back by the forward

    def on_residual(self, layer: int, h: Tensor) -> None:
        self._residuals.append(h.float())  # [dim]

    def on_mid_residual(self, layer: int, h: Tensor) -> None:
        self._mid.append(h.float())  # [dim]

    def on_attention(self, layer: int, q: Tensor, k: Tensor, first: int) -> None:
        self._queries.append(q)  # views; the weights of every layer are computed in one multiply in `detail`
        self._keys.append(k)
        self._firsts.append(first)

    def on_feed_forward(self, layer: int, gate: Tensor, up: Tensor) -> None:
        self._gates.append(gate.clone())  # [ffn], not a view that would keep the whole batch's projection alive;
        self._ups.append(up.clone())  # ranked once for every layer in `detail`, off the layer loop

    def lens_streams(self) -> Tensor:
        """Each lens layer's stream after its attention half, then after the whole layer: [2 * lens layers, dim]."""
        self._lens_layers = self.lens if self.lens is not None else lens_layers(len(self._mid))
        return torch.cat(
            [
                torch.stack([self._mid[i] for i in self._lens_layers]),
                torch.stack([self._residuals[i + 1] for i in self._lens_layers]),
            ]
        )

    def on_lens(self, logits: Tensor) -> None:
        self._lens_logits = logits

    def _top_neurons(self) -> list[list[Neuron]]:
        """Per layer, the neurons that send the most into the down projection: largest |act(gate) * up|."""
        # [L, ffn]: how far each neuron's gate lets its up value through
        opened = torch.stack(self._gates).float()
        up = torch.stack(self._ups).float()  # [L, ffn]
        activation = opened * up
        top = activation.abs().topk(min(TOP_NEURONS, activation.shape[1]), dim=-1).indices  # [L, k]
        # [L, k, 3]
        values = torch.stack([opened.gather(1, top), up.gather(1, top), activation.gather(1, top)], dim=-1).tolist()
        return [[Neuron(i, g, u, a) for i, (g, u, a) in zip(ids, rows)] for ids, rows in zip(top.tolist(), values)]

    def detail(self) -> LayerDetail:
        """Assemble the recorded tensors and the lens the forward computed."""
        assert self._lens_logits is not None, "detail() after the forward pass that fed this probe"
        stream = torch.stack(self._residuals)  # [L + 1, dim]
        mid = torch.stack(self._mid)  # [L, dim]
        layers, logits = self._lens_layers, self._lens_logits  # [2 * len(layers), V]
        best_logit, best_id = logits.max(dim=-1)
        best_p = (best_logit - torch.logsumexp(logits, dim=-1)).exp()
        guesses = [LensGuess(layer, i, p) for layer, i, p in zip(layers * 2, best_id.tolist(), best_p.tolist())]
        return LayerDetail(
            attention=attention_weights(torch.stack(self._queries), torch.stack(self._keys), torch.tensor(self._firsts))
            .to(torch.float16)
            .cpu()
            .numpy(),  # [L, H, S]
            residual_norms=stream.norm(dim=-1).tolist(),
            logit_lens=guesses[len(layers) :],
            attention_update_norms=(mid - stream[:-1]).norm(dim=-1).tolist(),
            feed_forward_update_norms=(stream[1:] - mid).norm(dim=-1).tolist(),
            logit_lens_after_attention=guesses[: len(layers)],
            top_neurons=self._top_neurons(),
        )
