"""The gateway's Turn: one request's life (authenticate → limit → route → generate → settle → usage row), against a
real in-process worker on the tiny model; what it counts, what it tells observers, and how it ends."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from inprocess import HI, with_tiny_worker

from inference.params import SamplingParams
from webapp.catalog import ModelRoute
from webapp.gateway import lifecycle
from webapp.gateway.client import ChoiceEvent
from webapp.gateway.errors import GatewayError
from webapp.gateway.identity import identify_session
from webapp.gateway.lifecycle import Turn, Usage
from webapp.usage.models import UsageRecord
from webapp.worker import wire

pytestmark = pytest.mark.django_db(transaction=True)
UNLIMITED: dict[str, Any] = {"ROUNDTRIP_ANONYMOUS_LIMITS": {}, "ROUNDTRIP_ANONYMOUS_ADDRESS_LIMITS": {}}


class Recorder:
    """An observer that writes down what it hears, and asks for a trace at `wants` when a turn starts."""

    def __init__(self, wants: wire.Level = "off") -> None:
        self.wants = wants
        self.heard: list[str] = []

    async def starting(self, turn: Turn) -> None:
        self.heard.append("starting")
        turn.trace_at_least(self.wants)

    async def started(self, turn: Turn) -> None:
        self.heard.append(f"started:{turn.level}")

    async def event(self, turn: Turn, index: int, event: wire.TraceEvent) -> None:
        self.heard.append(type(event).__name__)

    async def settled(self, turn: Turn, record: UsageRecord) -> None:
        self.heard.append(f"settled:{record.status}")


def admitted_turn() -> Turn:
    turn = Turn("test.lifecycle", "127.0.0.1", stream=True)
    turn.authenticated(identify_session(None, "lifecycle-test", "127.0.0.1"), time.perf_counter())
    return turn


def test_a_turn_runs_every_stage_and_leaves_one_usage_row_with_what_it_used(tiny_model_path: Path) -> None:
    recorder = Recorder()

    async def body(route: ModelRoute) -> None:
        turn = admitted_turn()
        await turn.admit("tiny")
        await turn.generate(HI, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
        events = [m.event async for m in turn.messages() if isinstance(m, ChoiceEvent)]
        record = await turn.settle()
        assert await turn.settle() is record  # exactly once
        assert (record.status, record.finish_reason, record.completion_tokens) == (200, "length", 5)
        assert record.prompt_tokens == turn.usage.prompt_tokens > 0 and record.worker == turn.ctx.worker != ""
        assert [s.name for s in turn.ctx.stages] == ["authenticate", "rate_limit", "route", "usage_log"]
        assert isinstance(events[-1], wire.Finished) and turn.finish_reason == "length"
        assert turn.fingerprint is not None and turn.fingerprint.startswith("fp_")

    lifecycle.observe(recorder)
    try:
        with_tiny_worker(tiny_model_path, body, **UNLIMITED)
    finally:
        lifecycle.unobserve(recorder)
    assert recorder.heard[:2] == ["starting", "started:off"] and recorder.heard[-1] == "settled:200"
    assert recorder.heard.count("Sampled") == 5 and "Finished" in recorder.heard
    assert UsageRecord.objects.filter(endpoint="test.lifecycle").count() == 1


def test_an_observer_may_ask_for_the_trace_and_the_answer_stays_the_same(tiny_model_path: Path) -> None:
    tracer = Recorder(wants="summary")

    async def run(route: ModelRoute) -> list[wire.TraceEvent]:
        turn = admitted_turn()
        await turn.admit("tiny")
        await turn.generate(HI, SamplingParams(temperature=0.0, max_tokens=4))
        events = [m.event async for m in turn.messages() if isinstance(m, ChoiceEvent)]
        await turn.settle()
        return events

    answers: dict[str, list[wire.TraceEvent]] = {}

    async def body(route: ModelRoute) -> None:
        answers["plain"] = await run(route)
        lifecycle.observe(tracer)
        try:
            answers["traced"] = await run(route)
        finally:
            lifecycle.unobserve(tracer)

    with_tiny_worker(tiny_model_path, body, **UNLIMITED)
    assert "started:summary" in tracer.heard
    assert not any(isinstance(e, wire.Tokenized) for e in answers["plain"])
    assert any(isinstance(e, wire.Tokenized) for e in answers["traced"])
    texts = {name: [e.text for e in events if isinstance(e, wire.Finished)] for name, events in answers.items()}
    assert texts["plain"] == texts["traced"]


def test_trace_at_least_never_lowers_what_was_asked() -> None:
    turn = Turn("test.lifecycle", None)
    turn.level = "full"
    turn.trace_at_least("summary")
    assert turn.level == "full"


@pytest.mark.parametrize(
    "exc, status, code",
    [
        (GatewayError(429, "slow down", "rate_limit_exceeded", "rate_limit"), 429, "rate_limit"),
        (asyncio.CancelledError(), 499, "client_closed_request"),
        (KeyError("internal detail"), 500, "server_error"),
    ],
)
def test_a_failure_becomes_one_gateway_error_in_openais_shape(exc: BaseException, status: int, code: str) -> None:
    turn = Turn("test.lifecycle", None)
    error = turn.fail(exc)
    assert (error.status, error.code, turn.status) == (status, code, status)
    assert "internal detail" not in error.message and set(error.body()["error"]) == {"message", "type", "param", "code"}
    assert turn.finish_reason == ("cancelled" if status == 499 else "error")


def test_usage_counts_sampled_tokens_until_each_choice_finishes() -> None:
    usage = Usage()
    sampled = wire.Sampled(
        t=0.0, step=1, token_id=3, token="a", bytes=[97], logprob=-0.1, rank=1, is_stop=False, duration=0.0
    )
    timings = wire.Timings(
        tokenize=0,
        queue=0,
        prefill=0,
        prefill_saved=0,
        ttft=0,
        decode=0,
        total=0,
        token_times=[],
        mean_itl=None,
        decode_tokens_per_s=None,
    )
    for index in (0, 0, 1):
        usage.count(index, sampled)
    assert usage.completion_tokens == 3 and usage.first_token_at is not None
    usage.count(
        0,
        wire.Finished(
            t=1.0,
            finish_reason="stop",
            prompt_tokens=7,
            completion_tokens=2,
            seed=0,
            text="aa",
            timings=timings,
            cached_tokens=4,
        ),
    )
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (7, 3, 4)
    assert usage.as_openai()["total_tokens"] == 10
