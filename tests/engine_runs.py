"""Running requests through an engine on a loaded model, for the engine's and the what-if tools' tests."""

from __future__ import annotations

from typing import Any

from inference.engine import Engine
from inference.loader import LoadedModel
from inference.outputs import SequenceOutput
from inference.params import SamplingParams
from inference.scheduler import SchedulerConfig
from inference.sequence import SequenceRequest
from inference.trace import Sampled, TraceEvent, TraceLevel

PROMPTS = [
    [1, 50, 60, 70],
    [1, 200, 3, 44, 45, 46, 47],
    [1, 9],
    [1, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89],
    [1, 120, 130],
    [1, 66, 67, 68, 69],
]
NEAR_TIE = 1e-4  # top-two logit gap (tiny model, float32) within which batched arithmetic may pick the other token


def make_engine(loaded: LoadedModel, **config: Any) -> Engine:
    return Engine(loaded.model, loaded.stop_ids, loaded.tokenizer.token_bytes, SchedulerConfig(**config))


def sequence_request(rid: str, prompt: list[int], level: TraceLevel = TraceLevel.OFF, **params: Any) -> SequenceRequest:
    params.setdefault("temperature", 0.0)
    params.setdefault("max_tokens", 24)
    return SequenceRequest(rid, prompt, SamplingParams(**params), level)


def run_all(engine: Engine, requests: list[SequenceRequest], max_steps: int = 500) -> dict[str, list[SequenceOutput]]:
    """Add every request, step until all are done; each request's outputs in order."""
    for request in requests:
        engine.scheduler.add(request)
    outputs: dict[str, list[SequenceOutput]] = {r.request_id: [] for r in requests}
    done: set[str] = set()
    for _ in range(max_steps):
        for output in engine.step():
            outputs[output.request_id].append(output)
            if output.done:
                done.add(output.request_id)
        engine.scheduler.finish_step()  # as the engine does, once the outputs are sent
        if done == set(outputs):
            return outputs
    raise AssertionError(f"not finished after {max_steps} steps: {set(outputs) - done}")


def events_of(outputs: list[SequenceOutput]) -> list[TraceEvent]:
    return [e for o in outputs for e in o.events]


def tokens_of(outputs: list[SequenceOutput]) -> list[Sampled]:
    return [e for e in events_of(outputs) if isinstance(e, Sampled)]


def alone(loaded: LoadedModel, request: SequenceRequest) -> list[Sampled]:
    return tokens_of(run_all(make_engine(loaded), [request])[request.request_id])


def assert_same_or_near_tie(batched: list[Sampled], alone: list[Sampled], tolerance: float) -> None:
    """Identical tokens, or at the first difference both choices were among the alone run's best (its top logprobs)
    and the batched run's within `tolerance` of the best: a near-tie, of two or more tokens."""
    ids_b, ids_a = [s.token_id for s in batched], [s.token_id for s in alone]
    if ids_b == ids_a:
        return
    at = next((i for i, (x, y) in enumerate(zip(ids_b, ids_a)) if x != y), min(len(ids_a), len(ids_b)))
    assert at < min(len(ids_a), len(ids_b)), "one run stopped where the other did not"
    top = dict(alone[at].top_logprobs)
    assert ids_a[at] in top and ids_b[at] in top, (
        f"diverged at {at} to a token outside the alone run's best {sorted(top)}"
    )
    gap = max(top.values()) - top[ids_b[at]]
    assert gap < tolerance, f"diverged at {at} with gap {gap}"
