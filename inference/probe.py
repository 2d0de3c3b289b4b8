"""The `full`-level look inside a forward pass, for one token of one sequence.

The model hands this probe the token's residual stream and attention inputs (its own
row only, whoever else is in the batch); the probe computes attention weights, residual
norms and the logit lens itself, so the model's forward stays the plain computation
when no probe is given.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from inference.model import Transformer
from inference.trace import LayerDetail


LIVE_LENS_LAYERS = 10  # logit-lens rows computed while generating; each costs a pass through the 49k-token head


def lens_layers(n_layers: int, count: int | None = LIVE_LENS_LAYERS) -> list[int]:
    """`count` evenly spaced layers ending with the last (every layer when count is None or covers them)."""
    if count is None or count >= n_layers:
        return list(range(n_layers))
    return sorted({round((k + 1) * n_layers / count) - 1 for k in range(count)})


class LayerProbe:
    """`lens`: the layers whose logit-lens guess to compute (default: `lens_layers`)."""

    def __init__(self, lens: list[int] | None = None) -> None:
        self.lens = lens
        self._residuals: list[Tensor] = []
        self._attention: list[Tensor] = []

    def on_residual(self, layer: int, h: Tensor) -> None:
        self._residuals.append(h.float())  # [dim]

    def on_attention(self, layer: int, q: Tensor, k: Tensor) -> None:
        """Recompute the token's attention weights over every position it sees: q [H, hd], k [KV, S, hd]."""
        n_kv, hd = k.shape[0], k.shape[2]
        grouped = q.float().view(n_kv, -1, hd)  # [KV, group, hd]: the query heads that share each key head
        scores = torch.bmm(grouped, k.float().transpose(1, 2)).flatten(0, 1) / math.sqrt(hd)  # [H, S]
        self._attention.append(torch.softmax(scores, dim=-1))

    def detail(self, model: Transformer) -> LayerDetail:
        """Assemble the recorded tensors; the logit lens reads each layer's output through the final norm and head."""
        stream = torch.stack(self._residuals)  # [L + 1, dim]
        layers = self.lens if self.lens is not None else lens_layers(model.config.n_layers)
        logits = model.logits(stream[1:][layers], refine=False)  # [len(layers), V] from those layers' outputs
        best_logit, best_id = logits.max(dim=-1)
        best_p = (best_logit - torch.logsumexp(logits, dim=-1)).exp()
        return LayerDetail(
            attention=torch.stack(self._attention).to(torch.float16).cpu().numpy(),  # [L, H, S]
            residual_norms=stream.norm(dim=-1).tolist(),
            logit_lens=list(zip(layers, best_id.tolist(), best_p.tolist())),
        )
