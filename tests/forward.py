"""Plain forward passes for tests: a batch of chunks through a cache, every position's logits, the next token's."""

from __future__ import annotations

import torch

from inference.batch import Chunk
from inference.kv_cache import SlotCache
from inference.model import Transformer


def forward(
    model: Transformer, cache: SlotCache, chunks: list[tuple[Chunk, list[int]]], every_token: bool = False
) -> torch.Tensor:
    """One forward over `chunks` (each with its tokens) in `cache`: logits of every chunk's last token, or of
    `every_token`."""
    plan = model.plan([c for c, _ in chunks])
    tokens = torch.tensor([t for _, ids in chunks for t in ids])
    with torch.inference_mode():
        return model(tokens, plan, cache, logits_for=torch.arange(len(tokens)) if every_token else None)


def all_logits(model: Transformer, ids: list[int]) -> torch.Tensor:
    """float32 logits [T, V] for every position of `ids`, in a fresh cache."""
    return forward(model, model.new_cache(1, len(ids)), [(Chunk(0, 0, len(ids)), ids)], every_token=True)


def last_logits(model: Transformer, ids: list[int]) -> torch.Tensor:
    """float32 logits [V] for the token after `ids`, computed from scratch."""
    plan = model.plan([Chunk(0, 0, len(ids))])
    with torch.inference_mode():
        return model(torch.tensor(ids, device=model.device), plan, model.new_cache(1, len(ids)))[0]
