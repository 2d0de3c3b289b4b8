"""One model's engine: every step, the scheduler's plan run through the model, and what it meant for each sequence.

    scheduled = scheduler.schedule()                         # which rows, which tokens
    result = runner.execute(scheduled.chunks)                # one batched forward
    outputs = scheduler.update_from_output(scheduled, result)  # tokens, text, trace events, who is done

The scheduler owns the KV cache's slots and the runner writes into the same cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from inference.model import Transformer
from inference.model_runner import ModelRunner
from inference.outputs import SequenceOutput
from inference.scheduler import Scheduler, SchedulerConfig


class Engine:
    def __init__(
        self,
        model: Transformer,
        stop_ids: frozenset[int],
        token_bytes: Sequence[bytes],
        config: SchedulerConfig = SchedulerConfig(),  # noqa: B008 (frozen)
    ) -> None:
        with torch.inference_mode():
            cache = model.new_cache(0, 0)
        self.model = model
        self.scheduler = Scheduler(cache, model.config.vocab_size, stop_ids, token_bytes, config)
        self.runner = ModelRunner(model, cache)

    def step(self) -> list[SequenceOutput]:
        """One step for every running sequence: what each produced (aborted and newly admitted ones included)."""
        scheduled = self.scheduler.schedule()
        if not scheduled.chunks:
            return scheduled.outputs
        result = self.runner.execute(scheduled.chunks)
        return scheduled.outputs + self.scheduler.update_from_output(scheduled, result)
