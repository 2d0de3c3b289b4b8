"""The engine thread: accepts, streams, interleaves, refuses when full and stops a cancelled request."""

from __future__ import annotations

import gc
import logging
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from load_settings import cpu

from inference.loader import load_model
from inference.params import SamplingParams
from inference.scheduler import SchedulerConfig
from webapp.worker import wire
from webapp.worker.runner import EngineRunner

HI = [{"role": "user", "content": "the heat is on"}]


class Replies:
    """Collects what the runner emits, per reply channel."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.ready: queue.Queue[str] = queue.Queue()
        self.sent_at: dict[int, float] = {}  # id(message) -> when the runner emitted it

    def emit(self, channel: str, reply: wire.Reply) -> None:
        """Each trace event as its own {"type": "event"} message; the rest as the channel layer carries them."""
        message = wire.encode(reply)
        parts = (
            [{"type": "event", "request_id": message["request_id"], "event": e} for e in message["events"]]
            if message["type"] == "events"
            else [message]
        )
        for part in parts:
            self.sent_at[id(part)] = time.perf_counter()
            self.inbox.put((channel, part))

    def until(self, channel: str, predicate: Any, timeout: float = 30) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                ch, message = self.inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if ch == channel:
                got.append(message)
                if predicate(message):
                    return got
        raise AssertionError(f"timed out; got {got[-3:]}")


def _finished(m: dict[str, Any]) -> bool:
    return m["type"] == "error" or (m["type"] == "event" and m["event"]["event"] == "finished")


def _generate(request_id: str, max_tokens: int = 20, **extra: Any) -> wire.Generate:
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=max_tokens)
    return wire.Generate(
        request_id=request_id,
        model="tiny",
        reply_to=f"reply.{request_id}",
        messages=HI,
        params=params,
        sent_at=time.time(),
        **extra,
    )


@pytest.fixture
def runner(tiny_model_path: Path) -> Iterator[tuple[EngineRunner, Replies]]:
    replies = Replies()
    engine = EngineRunner(
        {"tiny": lambda: load_model(str(tiny_model_path), cpu())},
        replies.ready.put,
        replies.emit,
        "control.x",
        SchedulerConfig(max_batch=2, max_waiting=2),
    )
    assert replies.ready.get(timeout=60) == "tiny"
    yield engine, replies
    engine.stop()


def test_it_streams_a_request_and_finishes(runner: tuple[EngineRunner, Replies]) -> None:
    engine, replies = runner
    engine.submit("tiny", _generate("a"))
    got = replies.until("reply.a", _finished)
    assert [m["type"] for m in got[:2]] == ["queued", "accepted"] and got[1]["control"] == "control.x"
    finished = got[-1]["event"]
    assert finished["completion_tokens"] == 20 and finished["timings"]["queue"] >= 0


def test_what_was_loaded_is_frozen_out_of_the_garbage_collectors_full_passes(
    runner: tuple[EngineRunner, Replies],
) -> None:
    """A full collection over Django's, torch's and the model's objects took 50-140 ms, stalling every stream."""
    deadline = time.monotonic() + 10  # frozen right after the models are ready
    while gc.get_freeze_count() < 10_000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gc.get_freeze_count() >= 10_000


def test_a_bad_request_is_an_error_reply_not_a_dead_thread(runner: tuple[EngineRunner, Replies]) -> None:
    engine, replies = runner
    engine.submit("tiny", _generate("bad", max_tokens=10_000))
    error = replies.until("reply.bad", _finished)[-1]
    assert error["type"] == "error" and error["code"] == "context_length_exceeded" and error["status"] == 400
    engine.submit("tiny", _generate("after"))
    assert replies.until("reply.after", _finished)[-1]["type"] == "event"


def test_a_cancelled_request_stops_within_one_token(runner: tuple[EngineRunner, Replies]) -> None:
    engine, replies = runner
    engine.submit("tiny", _generate("c", max_tokens=200))
    replies.until(
        "reply.c", lambda m: m["type"] == "event" and m["event"]["event"] == "sampled" and m["event"]["step"] == 3
    )
    cancelled_at = time.perf_counter()
    engine.cancel("c")
    time.sleep(0.3)
    later = []
    while not replies.inbox.empty():
        later.append(replies.inbox.get()[1])
    after_cancel = [
        m
        for m in later
        if replies.sent_at[id(m)] > cancelled_at and m["type"] == "event" and m["event"]["event"] == "sampled"
    ]
    assert len(after_cancel) <= 1
    assert not any(m["type"] == "event" and m["event"]["event"] == "finished" for m in later)


def test_requests_beyond_the_queue_get_503_at_once(runner: tuple[EngineRunner, Replies]) -> None:
    engine, replies = runner
    for i in range(8):
        engine.submit("tiny", _generate(f"q{i}", max_tokens=200))
    errors = []
    for i in range(8):
        first = replies.until(f"reply.q{i}", lambda m: m["type"] in ("queued", "error"))[-1]
        if first["type"] == "error":
            errors.append(first)
    assert errors and all(e["status"] == 503 and e["code"] == "overloaded" and e["retry_after"] >= 1 for e in errors)


def test_a_model_that_fails_to_load_is_reported_and_the_others_still_load(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    replies = Replies()
    loaders = {
        "broken": lambda: load_model(str(tmp_path / "missing.gguf"), cpu()),
        "tiny": lambda: load_model(str(tiny_model_path), cpu()),
    }
    engine = EngineRunner(
        loaders, replies.ready.put, replies.emit, "control.x", SchedulerConfig(max_batch=1, max_waiting=1)
    )
    try:
        assert [replies.ready.get(timeout=60), replies.ready.get(timeout=60)] == ["broken", "tiny"]
        assert "missing.gguf: no such file" in engine.failures["broken"]
        engine.submit("tiny", _generate("ok", max_tokens=2))
        assert replies.until("reply.ok", _finished)[-1]["type"] == "event"
    finally:
        engine.stop()


def test_step_mode_pauses_after_each_token_until_next(runner: tuple[EngineRunner, Replies]) -> None:
    engine, replies = runner
    engine.submit("tiny", _generate("s", max_tokens=5, step=True))
    replies.until("reply.s", lambda m: m["type"] == "event" and m["event"]["event"] == "text")
    time.sleep(0.3)
    assert replies.inbox.empty()  # paused after the first token
    for step in (2, 3):
        engine.next_token("s")
        got = replies.until("reply.s", lambda m: m["type"] == "event" and m["event"]["event"] == "text")
        assert got[-1]["event"]["step"] == step
        time.sleep(0.2)
        assert replies.inbox.empty()


def test_a_step_whose_bookkeeping_fails_ends_its_requests_in_errors_and_the_engine_goes_on(
    runner: tuple[EngineRunner, Replies],
) -> None:
    engine, replies = runner
    scheduler = engine.models["tiny"].scheduler
    finish_step = scheduler.finish_step
    failed: list[bool] = []

    def failing_once() -> None:
        if scheduler.running and not failed:
            failed.append(True)
            raise MemoryError("no room to copy the cache")
        finish_step()

    scheduler.finish_step = failing_once  # type: ignore[method-assign]
    engine.submit("tiny", _generate("doomed", max_tokens=200))
    error = replies.until("reply.doomed", _finished)[-1]
    assert error["type"] == "error" and failed
    engine.submit("tiny", _generate("after"))
    assert replies.until("reply.after", _finished)[-1]["type"] == "event"


def test_a_request_the_engine_refuses_ends_at_once_in_the_askers_terms(
    runner: tuple[EngineRunner, Replies], caplog: pytest.LogCaptureFixture
) -> None:
    """No engine command fails silently: the client's mistake is its 400, an engine fault a 500, both at once. The log
    names the request and the error, never what the client sent."""
    caplog.set_level(logging.INFO, logger="roundtrip.worker")
    engine, replies = runner
    bias = SamplingParams(max_tokens=4, logit_bias=((99_999, 1.0),))
    engine.submit(
        "tiny", wire.Generate(request_id="bias", model="tiny", reply_to="reply.bias", messages=HI, params=bias)
    )
    error = replies.until("reply.bias", _finished, timeout=5)[-1]
    assert (error["type"], error["status"], error["param"]) == ("error", 400, "logit_bias")
    scheduler = engine.models["tiny"].scheduler

    def broken(request: Any) -> Any:
        raise RuntimeError("an engine bug")

    scheduler.add = broken  # type: ignore[method-assign]
    try:
        engine.submit("tiny", _generate("broken"))
        error = replies.until("reply.broken", _finished, timeout=5)[-1]
    finally:
        del scheduler.add
    assert (error["type"], error["status"], error["code"]) == ("error", 500, "server_error")
    engine.submit("tiny", _generate("after"))
    assert replies.until("reply.after", _finished)[-1]["type"] == "event"
    # the client's mistake is its answer, not a log line; the server's own fault is logged by request, with a traceback
    said = {r.getMessage(): r for r in caplog.records}
    assert list(said) == ["adding broken failed"] and said["adding broken failed"].exc_info is not None
