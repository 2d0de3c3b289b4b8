"""One model as a worker serves it: loaded, warmed up, with its engine and what the heartbeat says about it."""

from __future__ import annotations

from dataclasses import dataclass

from inference.engine import Engine
from inference.loader import LoadedModel
from inference.params import SamplingParams
from inference.pipeline import ChatPipeline
from inference.scheduler import Scheduler, SchedulerConfig
from webapp.worker import wire


@dataclass
class Served:
    """A loaded model: its pipeline (template, tokenizer), its engine, and its batch, queue and cache as of the last
    step."""

    pipeline: ChatPipeline
    engine: Engine
    slots: wire.ModelSlots
    pending: int = 0  # accepted by `EngineRunner.submit`, not yet in the scheduler (being tokenized)
    prefix_seen: tuple[int, int] = (0, 0)  # prefix-cache totals already counted in the metrics

    @property
    def loaded(self) -> LoadedModel:
        return self.pipeline.loaded

    @property
    def scheduler(self) -> Scheduler:
        return self.engine.scheduler

    @classmethod
    def start(cls, loaded: LoadedModel, config: SchedulerConfig) -> Served:
        """Ready to serve: warmed up, so the first real request does not pay for kernel selection and first-touch
        pages."""
        pipeline = ChatPipeline(loaded)
        warm = pipeline.prepare([{"role": "user", "content": "Hello"}], SamplingParams(temperature=0.0, max_tokens=2))
        for _ in pipeline.stream(warm):
            pass
        slots = wire.ModelSlots(
            running=0, waiting=0, max_batch=config.max_batch, max_waiting=config.max_waiting, kv_usage=0.0
        )
        return cls(pipeline, pipeline.engine(config), slots)
