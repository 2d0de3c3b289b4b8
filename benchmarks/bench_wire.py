"""What one step's reply costs on the wire, per representation: build it, encode it for the channel layer, parse it
back.

    python benchmarks/bench_wire.py

A step sends each stream one Events reply: at `off`, a sampled token and its text; at `summary`, also the batch and
forward events and the sampling decision (10 candidates). Three ways to carry it, timed on the same messages:

- plain dicts, as the worker built them before the wire was typed: no encoding, no checks, read by string keys;
- msgspec Structs (`webapp.worker.wire`, what Roundtrip uses): `to_builtins` on the worker, `convert` (every field
  checked) on the web side;
- pydantic models of the same shape: `model_dump` on the worker, `validate_python` on the web side.

Prints microseconds per message (best of 5 rounds) for each; a decode step of one stream takes about 6 ms here, so
these are shares of a per-token budget.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from webapp.worker import wire

ROUNDS, REPEATS = 5, 5000


def summary_step() -> wire.Events:
    candidates = [
        wire.Candidate(
            token_id=100 + i,
            token=f" word{i}",
            raw_prob=0.5 / (i + 1),
            adjusted_prob=0.6 / (i + 1),
            removed_by=None if i < 4 else "top_k",
            final_prob=0.7 / (i + 1) if i < 4 else 0.0,
        )
        for i in range(10)
    ]
    detail = wire.SamplingDetail(candidates=candidates, draw=0.42, kept=4, eos_prob=0.001)
    return wire.Events(
        request_id="chatcmpl-0123456789abcdef01234567",
        events=[
            wire.BatchStep(
                t=1.0, step=9, batch_size=1, prefill_tokens=0, decode_tokens=1, duration=0.006, requests=["chatcmpl-x"]
            ),
            wire.ForwardStep(
                t=1.0, step=3, phase="decode", position=30, n_tokens=1, kv_length=31, duration=0.006, batch_step=9
            ),
            wire.Sampled(
                t=1.001,
                step=3,
                token_id=100,
                token=" word0",
                bytes=[32, 119],
                logprob=-0.36,
                rank=1,
                is_stop=False,
                duration=0.0002,
                detail=detail,
            ),
            wire.TextDelta(
                t=1.001, step=3, token_id=100, token=" word0", text=" word0", pending_bytes=[], held_text=""
            ),
        ],
    )


def off_step() -> wire.Events:
    return wire.Events(
        request_id="chatcmpl-0123456789abcdef01234567",
        events=[
            wire.Sampled(
                t=1.001,
                step=3,
                token_id=100,
                token=" word0",
                bytes=[32, 119],
                logprob=-0.36,
                rank=1,
                is_stop=False,
                duration=0.0002,
            ),
            wire.TextDelta(
                t=1.001, step=3, token_id=100, token=" word0", text=" word0", pending_bytes=[], held_text=""
            ),
        ],
    )


# --- the same shapes as pydantic models -----------------------------------------------------------------------------


class PCandidate(pydantic.BaseModel):
    token_id: int
    token: str
    raw_prob: float
    adjusted_prob: float
    removed_by: str | None
    final_prob: float
    bias: float = 0.0


class PSamplingDetail(pydantic.BaseModel):
    candidates: list[PCandidate]
    draw: float | None
    kept: int
    eos_prob: float
    grammar_cut: int = 0
    mask_seconds: float = 0.0


class PTopLogprob(pydantic.BaseModel):
    id: int
    token: str
    logprob: float
    bytes: list[int]


class PBatch(pydantic.BaseModel):
    event: Literal["batch"]
    t: float
    step: int
    batch_size: int
    prefill_tokens: int
    decode_tokens: int
    duration: float
    requests: list[str]


class PForward(pydantic.BaseModel):
    event: Literal["forward"]
    t: float
    step: int
    phase: Literal["prefill", "decode"]
    position: int
    n_tokens: int
    kv_length: int
    duration: float
    batch_step: int = 0
    detail: dict[str, Any] | None = None


class PSampled(pydantic.BaseModel):
    event: Literal["sampled"]
    t: float
    step: int
    token_id: int
    token: str
    bytes: list[int]
    logprob: float
    rank: int
    is_stop: bool
    duration: float
    top_logprobs: list[PTopLogprob] = []
    detail: PSamplingDetail | None = None


class PText(pydantic.BaseModel):
    event: Literal["text"]
    t: float
    step: int
    token_id: int
    token: str
    text: str
    pending_bytes: list[int]
    held_text: str


class PEvents(pydantic.BaseModel):
    type: Literal["events"]
    request_id: str
    events: list[Annotated[PBatch | PForward | PSampled | PText, pydantic.Field(discriminator="event")]]
    index: int = 0


def best_microseconds(fn: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for _ in range(REPEATS):
            fn()
        best = min(best, (time.perf_counter() - started) / REPEATS)
    return best * 1e6


def measure(step: Callable[[], wire.Events]) -> dict[str, tuple[float, float]]:
    """(worker: build and encode, web side: parse) microseconds per message, for each representation."""
    plain = wire.encode(step())
    return {
        "msgspec": (
            best_microseconds(lambda: wire.encode(step())),
            best_microseconds(lambda: wire.decode_reply(plain)),
        ),
        "pydantic": (
            best_microseconds(lambda: PEvents.model_validate(plain).model_dump()),
            best_microseconds(lambda: PEvents.model_validate(plain)),
        ),
        "dict, unchecked": (best_microseconds(lambda: _copy(plain)), 0.0),
    }


def _copy(value: Any) -> Any:
    """What building the same nested dict by hand costs (the worker's old replies), without any check."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def main() -> None:
    print(
        f"{'message':<34}{'representation':<17}{'worker':>10}{'web side':>10}{'round trip':>12}  (microseconds per "
        "message)"
    )
    for name, step in (("off: sampled + text", off_step), ("summary: 4 events, 10 candidates", summary_step)):
        for representation, (encode, decode) in measure(step).items():
            print(f"{name:<34}{representation:<17}{encode:>10.1f}{decode:>10.1f}{encode + decode:>12.1f}")
    print("worker: build the message and encode it for the channel layer; web side: parse it, checking every field.")


if __name__ == "__main__":
    main()
