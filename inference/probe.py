"""The `full`-level look inside a forward pass, for the newest token of sequence 0.

The model hands this probe its residual stream and its attention inputs; the probe
computes attention weights, residual norms and the logit lens itself, so the model's
forward stays the plain computation when no probe is given.
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
        self._residuals.append(h[0, -1].float())  # [dim]

    def on_attention(self, layer: int, q: Tensor, k: Tensor, mask: Tensor) -> None:
        """Recompute the newest query's attention weights: q [B, H, T, hd], k [B, KV, S, hd], mask [B, 1, T, S]."""
        group = q.shape[1] // k.shape[1]
        keys = k[0].float().repeat_interleave(group, dim=0)  # [H, S, hd]
        scores = keys @ q[0, :, -1].float().unsqueeze(-1) / math.sqrt(q.shape[-1])  # [H, S, 1]
        scores = scores.squeeze(-1).masked_fill(~mask[0, 0, -1], float("-inf"))  # [H, S]
        self._attention.append(torch.softmax(scores, dim=-1))

    def detail(self, model: Transformer) -> LayerDetail:
        """Assemble the recorded tensors; the logit lens reads each layer's output through the final norm and head."""
        stream = torch.stack(self._residuals)  # [L + 1, dim]
        lens_in = stream[1:].to(model.output.weight.dtype)  # outputs of layers 0..L-1
        probs = torch.softmax(model.output(model.output_norm(lens_in)).float(), dim=-1)  # [L, V]
        best_p, best_id = probs.max(dim=-1)
        return LayerDetail(
            attention=torch.stack(self._attention).to(torch.float16).cpu().numpy(),  # [L, H, S]
            residual_norms=stream.norm(dim=-1).tolist(),
            logit_lens=list(zip(best_id.tolist(), best_p.tolist())),
        )
