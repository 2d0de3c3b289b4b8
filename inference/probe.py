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


class LayerProbe:
    def __init__(self) -> None:
        self._residuals: list[Tensor] = []
        self._attention: list[Tensor] = []

    def on_residual(self, layer: int, h: Tensor) -> None:
        self._residuals.append(h.float())  # [dim]

    def on_attention(self, layer: int, q: Tensor, k: Tensor) -> None:
        """Recompute the token's attention weights over every position it sees: q [H, hd], k [KV, S, hd]."""
        group = q.shape[0] // k.shape[0]
        keys = k.float().repeat_interleave(group, dim=0)  # [H, S, hd]
        scores = (keys @ q.float().unsqueeze(-1)).squeeze(-1) / math.sqrt(q.shape[-1])  # [H, S]
        self._attention.append(torch.softmax(scores, dim=-1))

    def detail(self, model: Transformer) -> LayerDetail:
        """Assemble the recorded tensors; the logit lens reads each layer's output through the final norm and head."""
        stream = torch.stack(self._residuals)  # [L + 1, dim]
        probs = torch.softmax(model.logits(stream[1:]), dim=-1)  # [L, V] from the outputs of layers 0..L-1
        best_p, best_id = probs.max(dim=-1)
        return LayerDetail(
            attention=torch.stack(self._attention).to(torch.float16).cpu().numpy(),  # [L, H, S]
            residual_norms=stream.norm(dim=-1).tolist(),
            logit_lens=list(zip(best_id.tolist(), best_p.tolist())),
        )
