"""The engine's generator: lazy steps, so a consumer that stops stops the model within one token."""

from __future__ import annotations

from typing import Any

import pytest

from inference.engine import Engine
from inference.loader import LoadedModel
from inference.sampling import SamplingParams
from inference.trace import Sampled, TraceLevel


def test_closing_the_stream_stops_the_model_within_one_token(tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(tiny_model.model, frozenset())
    calls = []
    forward = tiny_model.model.forward

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny_model.model, "forward", counting)
    stream = engine.generate([1, 50, 60], SamplingParams(temperature=0.0, max_tokens=100))
    seen = 0
    for event in stream:
        if isinstance(event, Sampled):
            seen += 1
            if seen == 3:
                stream.close()
                break
    assert len(calls) == 3  # the prefill and two decode steps; nothing ran after the third token


def _sampled_ids(engine: Engine, level: TraceLevel = TraceLevel.OFF) -> list[Sampled]:
    params = SamplingParams(temperature=0.0, max_tokens=5)
    return [e for e in engine.generate([1, 50], params, level) if isinstance(e, Sampled)]


def test_it_stops_at_an_end_of_turn_token(tiny_model: LoadedModel) -> None:
    greedy = [e.token_id for e in _sampled_ids(Engine(tiny_model.model, frozenset()))]
    stop = greedy[2]
    events = _sampled_ids(Engine(tiny_model.model, frozenset({stop})), TraceLevel.SUMMARY)
    assert len(events) == greedy.index(stop) + 1
    assert events[-1].is_stop and not any(e.is_stop for e in events[:-1])
