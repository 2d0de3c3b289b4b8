"""The worker registry: heartbeats in the cache, who is alive, who takes the next request, and load progress."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from django.core.cache import cache

from webapp.worker import registry, wire


def status(worker: str, running: int = 0, waiting: int = 0, models: tuple[str, ...] = ("tiny",)) -> wire.WorkerStatus:
    slots = wire.ModelSlots(running=running, waiting=waiting, max_batch=4, max_waiting=4, kv_usage=0.0)
    return wire.WorkerStatus(
        worker=worker, channel=f"inbox.{worker}", host="h", pid=1, t=0.0, models=dict.fromkeys(models, slots)
    )


@pytest.fixture(autouse=True)
def clean_cache() -> Iterator[None]:
    cache.clear()
    registry.in_flight.clear()
    yield
    cache.clear()
    registry.in_flight.clear()


def test_a_beating_worker_is_alive_and_listed_for_the_models_it_holds() -> None:
    registry.beat(status("a"))
    registry.beat(status("b", models=("other",)))
    assert registry.is_alive("a") and [w.worker for w in registry.live_workers("tiny")] == ["a"]
    assert {w.worker for w in registry.live_workers()} == {"a", "b"}


def test_a_worker_that_leaves_is_gone_at_once() -> None:
    registry.beat(status("a"))
    registry.leave("a")
    assert not registry.is_alive("a") and registry.live_workers() == []


def test_an_unreadable_heartbeat_is_left_out_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    registry.beat(status("a"))
    registry.beat(status("b"))
    cache.set("rt:worker:b", {"worker": "b", "models": "not a dict"}, registry.HEARTBEAT_TTL)
    with caplog.at_level(logging.ERROR, logger="roundtrip.gateway"):
        assert [w.worker for w in registry.live_workers("tiny")] == ["a"]
    assert "unreadable heartbeat" in caplog.text


def test_the_least_loaded_worker_takes_the_next_request_counting_what_was_just_sent() -> None:
    busy, idle = status("busy", running=3), status("idle", running=1)
    assert registry.pick([busy, idle], "tiny") == idle
    registry.in_flight["idle"] += 4  # sent there since its last beat: more than the busy one holds
    assert registry.pick([busy, idle], "tiny") == busy
    assert registry.pick([], "tiny") is None


def test_load_progress_reads_back_and_a_ready_model_without_a_live_worker_is_unavailable() -> None:
    assert registry.model_load("tiny").state == "not started"
    registry.publish_load("tiny", wire.ModelLoad(state="loading", stage="converting", done=3, total=9))
    assert registry.model_load("tiny") == wire.ModelLoad(state="loading", stage="converting", done=3, total=9)
    registry.publish_load("tiny", wire.ModelLoad(state="ready", weights="fp32, 1 MB"))
    assert registry.model_load("tiny").state == "unavailable"
    registry.beat(status("a"))
    assert registry.model_load("tiny") == wire.ModelLoad(state="ready", weights="fp32, 1 MB")
