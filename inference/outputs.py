"""What one engine step passes between its parts (vLLM's shape): the scheduler's plan for the step, what the model
computed for it, and what each sequence produced.

    Scheduler.schedule() -> SchedulerOutput -> ModelRunner.execute() -> ModelOutput
    Scheduler.update_from_output(SchedulerOutput, ModelOutput) -> [SequenceOutput]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from inference.sampling import RowSummary
from inference.sequence import Phase, SequenceState
from inference.trace import LayerDetail, TraceEvent, TraceLevel


@dataclass(frozen=True)
class ScheduledChunk:
    """One sequence's row of the next forward: `tokens` at its next positions (a chunk of its prompt, or its last
    generated token), and whether the forward ends where it samples (a decode token, or its prompt's last chunk)."""

    state: SequenceState
    tokens: list[int]
    samples: bool

    @property
    def prefill(self) -> bool:
        return self.state.phase == Phase.PREFILL

    @property
    def probed(self) -> bool:
        """Whether the model should look inside the forward for this row's sampled token (`full` level)."""
        return self.samples and self.state.request.level == TraceLevel.FULL


@dataclass
class SequenceOutput:
    """What one sequence produced in a step; `done` when it left the scheduler."""

    request_id: str
    events: list[TraceEvent] = field(default_factory=list)
    done: bool = False
    error: Exception | None = None
    cancelled: bool = False


@dataclass
class SchedulerOutput:
    """The next forward's rows, in order, and what scheduling produced by itself (aborted requests leaving, newcomers'
    context events)."""

    chunks: list[ScheduledChunk]
    outputs: list[SequenceOutput] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)

    @property
    def prefill_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks if c.prefill)

    @property
    def decode_rows(self) -> int:
        return sum(not c.prefill for c in self.chunks)


@dataclass(frozen=True)
class ModelOutput:
    """One forward's results: float32 logits [rows that sample, V] on the CPU with each row's summary, and the
    look inside the forward (`full` level) for each scheduled chunk that asked for one; clocked around the forward."""

    logits: Tensor
    summaries: list[RowSummary]
    details: list[LayerDetail | None]  # per scheduled chunk
    started: float
    ended: float

    @property
    def duration(self) -> float:
        return self.ended - self.started
