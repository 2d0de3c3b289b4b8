"""One request's state without a model: logits go in by hand, tokens, text, finish reasons and clocks come out."""

from __future__ import annotations

from typing import Any

import torch

from inference.params import SamplingParams
from inference.sequence import Phase, SequenceRequest, SequenceState
from inference.trace import BatchStep, Finished, ForwardStep, Sampled, TextDelta, TraceEvent, TraceLevel

VOCAB = [b"<end>", b"a", b"b", b" stop", b"\xc3", b"\xa9", b"!"]
END = 0


def _state(level: TraceLevel = TraceLevel.OFF, prompt: list[int] | None = None, **params: Any) -> SequenceState:
    params.setdefault("temperature", 0.0)
    request = SequenceRequest("r", prompt or [1, 2, 1], SamplingParams(**params), level)
    return SequenceState(request, len(VOCAB), frozenset({END}), VOCAB)


def _logits(token: int) -> torch.Tensor:
    row = torch.zeros(len(VOCAB))
    row[token] = 10.0
    return row


def _batch(step: int = 1, size: int = 2) -> BatchStep:
    return BatchStep(1.0, step, size, 3, 1, 0.02, ["r", "other"])


def _feed(state: SequenceState, tokens: list[int]) -> list[TraceEvent]:
    """Run the sequence through its prompt, then sample `tokens` one by one."""
    events = state.admit(0, 0, 0.0)
    events += state.forwarded(_batch(), len(state.next_tokens(100)), 0.5, None)
    for token in tokens:
        events += state.sample(_logits(token))
        if state.phase == Phase.DONE:
            break
        events += state.forwarded(_batch(), len(state.next_tokens(100)), 0.5, None)
    return events


def _finished(events: list[TraceEvent]) -> Finished:
    assert isinstance(events[-1], Finished)
    return events[-1]


def test_it_feeds_its_prompt_in_chunks_then_its_last_token() -> None:
    state = _state(prompt=[1, 2, 1, 2, 1])
    state.admit(0, 0, 0.0)
    assert state.next_tokens(2) == [1, 2]
    state.forwarded(_batch(), 2, 0.0, None)
    assert state.phase == Phase.PREFILL and state.next_tokens(10) == [1, 2, 1]
    state.forwarded(_batch(), 3, 0.0, None)
    assert state.phase == Phase.DECODE and state.computed == 5
    state.sample(_logits(2))
    assert state.next_tokens(10) == [2]


def test_an_end_of_turn_token_finishes_with_stop_and_no_text() -> None:
    events = _feed(_state(), [1, 2, END])
    done = _finished(events)
    assert done.finish_reason == "stop" and done.text == "ab" and done.completion_tokens == 3
    assert not any(isinstance(e, TextDelta) and e.token_id == END for e in events)


def test_max_tokens_finishes_with_length() -> None:
    done = _finished(_feed(_state(max_tokens=2), [1, 1, 1]))
    assert done.finish_reason == "length" and done.text == "aa"


def test_a_stop_string_cuts_the_text_before_it() -> None:
    done = _finished(_feed(_state(stop=(" st",)), [1, 3, 2]))
    assert done.finish_reason == "stop" and done.text == "a"


def test_a_character_split_over_two_tokens_waits_for_its_second_byte() -> None:
    events = _feed(_state(TraceLevel.SUMMARY, max_tokens=3), [4, 5, 6])
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert [d.text for d in deltas] == ["", "é", "!"] and deltas[0].pending_bytes == b"\xc3"


def test_ignore_eos_keeps_going_past_the_end_token() -> None:
    done = _finished(_feed(_state(max_tokens=3, ignore_eos=True), [1, END, 2]))
    assert done.finish_reason == "length" and done.completion_tokens == 3 and done.text == "ab"


def test_step_mode_pauses_after_every_token() -> None:
    state = _state()
    state.request = SequenceRequest("r", [1, 2], SamplingParams(temperature=0.0), step_mode=True)
    state.admit(0, 0, 0.0)
    state.forwarded(_batch(), 2, 0.0, None)
    state.sample(_logits(1))
    assert state.paused


def test_off_level_records_no_steps_and_summary_refers_to_the_batch() -> None:
    assert not [e for e in _feed(_state(), [1, END]) if isinstance(e, (BatchStep, ForwardStep))]
    events = _feed(_state(TraceLevel.SUMMARY), [1, END])
    forwards = [e for e in events if isinstance(e, ForwardStep)]
    assert [f.phase for f in forwards] == ["prefill", "decode"] and all(f.batch_step == 1 for f in forwards)
    assert all(
        isinstance(e, BatchStep) for e in (events[i - 1] for i, x in enumerate(events) if isinstance(x, ForwardStep))
    )
    assert all(s.detail is not None for s in events if isinstance(s, Sampled))


def test_finished_reports_the_cache_hit_peers_and_clocks() -> None:
    state = _state(prompt=[1, 2, 1, 2])
    state.admit(0, 2, 0.0)
    assert state.computed == 2 and state.next_tokens(10) == [1, 2]
    state.forwarded(_batch(size=3), 2, 0.0, None)
    events = state.sample(_logits(END))
    done = _finished(events)
    assert done.cached_tokens == 2 and done.peers == ["other"] and done.max_batch_size == 3
    t = done.timings
    assert t.ttft == t.token_times[0] and t.queue >= 0 and t.total >= t.ttft
    assert t.prefill_saved == 2 * t.prefill / 2  # two tokens cached at the rate the other two were computed
