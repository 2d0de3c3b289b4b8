"""Runs a step's scheduled chunks through the model: one batched forward, its logits and their summaries.

The scheduler decides which tokens go in; this lays them out (`Transformer.plan`), puts a probe on the rows traced
at `full` level, runs the forward into the shared KV cache and hands back the rows that sample.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from inference.batch import Chunk
from inference.kv_cache import SlotCache
from inference.model import Transformer
from inference.outputs import ModelOutput, ScheduledChunk
from inference.probe import LayerProbe
from inference.sampling import summarize


class ModelRunner:
    def __init__(self, model: Transformer, cache: SlotCache) -> None:
        self.model = model
        self.cache = cache

    @torch.inference_mode()
    def execute(self, chunks: Sequence[ScheduledChunk]) -> ModelOutput:
        """One forward over `chunks` (each at its sequence's slot and next position)."""
        model, device = self.model, self.model.device
        plan = model.plan([Chunk(c.state.slot or 0, c.state.computed, len(c.tokens)) for c in chunks])
        last = plan.last_tokens.tolist()  # [chunks]: each chunk's last token in the flattened batch
        probes = {last[i]: LayerProbe() for i, c in enumerate(chunks) if c.probed}
        sampled_rows = torch.tensor(
            [last[i] for i, c in enumerate(chunks) if c.samples], device=device, dtype=torch.long
        )
        tokens = torch.tensor([token for c in chunks for token in c.tokens], device=device)  # [N]
        started = time.perf_counter()
        logits = model(tokens, plan, self.cache, probes, sampled_rows).cpu()  # also waits for the device: honest clocks
        ended = time.perf_counter()
        details = [probes[last[i]].detail() if c.probed else None for i, c in enumerate(chunks)]
        return ModelOutput(logits, summarize(logits), details, started, ended)
