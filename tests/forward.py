"""One plain forward pass over a single sequence, for tests that need a position's logits."""

from __future__ import annotations

import torch

from inference.batch import Chunk
from inference.model import Transformer


def last_logits(model: Transformer, ids: list[int]) -> torch.Tensor:
    """float32 logits [V] for the token after `ids`, computed from scratch."""
    plan = model.plan([Chunk(0, 0, len(ids))])
    with torch.inference_mode():
        return model(torch.tensor(ids, device=model.device), plan, model.new_cache(1, len(ids)))[0]
