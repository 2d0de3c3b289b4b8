"""The grown-up set-up: PostgreSQL, Redis, two web processes and a separate inference worker.

Same code, other settings: the channel layer and the rate-limit counters live in Redis,
usage rows in PostgreSQL, and the model in its own `runinferenceworker` process.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import psycopg
import pytest
from openai import OpenAI
from servers import (
    clear_of_minute_edge,
    free_port,
    manage,
    metric_samples,
    metric_value,
    server_env,
    start,
    stop,
    wait_ready,
)

pytestmark = pytest.mark.live  # starts web processes and workers of its own

HI = [{"role": "user", "content": "the heat is on"}]


@pytest.fixture
def cluster(
    postgres_url: str, redis_url: str, tiny_model_path: Path, tmp_path: Path
) -> Iterator[tuple[list[str], dict[str, str], list[Path]]]:
    env = {
        **server_env(),
        "DATABASE_URL": postgres_url,
        "REDIS_URL": redis_url,
        "ROUNDTRIP_MODELS": json.dumps([{"id": "tiny", "path": str(tiny_model_path), "aliases": []}]),
        "PYTHONUNBUFFERED": "1",
    }
    manage(env, "migrate", "--noinput")
    ports = [free_port(), free_port()]
    logs = [tmp_path / "worker.log", tmp_path / "web0.log", tmp_path / "web1.log"]
    processes = [
        start(env, logs[0], "runinferenceworker"),
        start(env, logs[1], "serve", "--port", str(ports[0])),
        start(env, logs[2], "serve", "--port", str(ports[1])),
    ]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url in urls:
            wait_ready(url, processes, logs)
        yield urls, env, logs
    finally:
        stop(processes)
        for log in logs:  # shown by pytest only when the test failed
            print(f"--- {log.name}\n{log.read_text(errors='replace')[-4000:]}")


def test_two_web_processes_share_one_worker_the_limits_and_the_database(
    cluster: tuple[list[str], dict[str, str], list[Path]],
) -> None:
    urls, env, _ = cluster
    key = manage(env, "createapikey", "cluster", "--rpm", "3").strip()
    clear_of_minute_edge()
    answers = []
    for url in urls:
        stream = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0).chat.completions.create(
            model="tiny",
            messages=HI,
            temperature=1.0,
            seed=5,
            max_tokens=12,
            stream=True,  # type: ignore[arg-type]
        )
        answers.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
    assert answers[0] == answers[1] != ""  # same seed, either web process, the one worker
    short = {
        "model": "tiny",
        "messages": HI,
        "max_tokens": 2,
        "ignore_eos": True,
    }  # a sampled end-of-turn cannot make it a "stop"
    third = httpx.post(
        f"{urls[0]}/v1/chat/completions", json=short, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )
    fourth = httpx.post(
        f"{urls[1]}/v1/chat/completions", json=short, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )
    assert (third.status_code, fourth.status_code) == (200, 429)  # one Redis counter for both processes
    with psycopg.connect(env["DATABASE_URL"]) as db:
        rows = db.execute(
            "SELECT status, finish_reason, completion_tokens FROM usage_usagerecord ORDER BY id"
        ).fetchall()
    assert rows == [(200, "length", 12), (200, "length", 12), (200, "length", 2), (429, "error", 0)]


@dataclass
class Stream:
    worker: str
    text: str = ""
    error: str = ""
    ended_at: float = 0.0


def _stream(url: str, key: str, i: int, first_token: threading.Event) -> Stream:
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": f"Tell me a story about ship number {i}."}],
        "temperature": 0,
        "max_tokens": 48,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
    ) as response:
        out = Stream(response.headers.get("x-roundtrip-worker", ""))
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                out.error = chunk["error"]["code"]
            for choice in chunk.get("choices", []):
                out.text += choice["delta"].get("content") or ""
                first_token.set()
    out.ended_at = time.monotonic()
    return out


def _live_workers(url: str) -> list[str]:
    """Workers that beat and hold the model (one still loading beats with nothing to offer yet)."""
    return [w["worker"] for w in httpx.get(f"{url}/health", timeout=5).json()["workers"] if w["models"]]


def _until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_two_workers_share_the_load_and_a_killed_one_fails_only_its_own_streams(
    postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    env = {
        **server_env(),
        "DATABASE_URL": postgres_url,
        "REDIS_URL": redis_url,
        "PYTHONUNBUFFERED": "1",
        "ROUNDTRIP_MAX_BATCH": "4",
    }
    manage(env, "migrate", "--noinput")
    key = manage(env, "createapikey", "two", "--rpm", "0", "--tpm", "0", "--concurrent", "0").strip().split()[-1]
    web_port, metrics_ports = free_port(), [free_port(), free_port()]
    logs = [tmp_path / "web.log", tmp_path / "worker0.log", tmp_path / "worker1.log", tmp_path / "worker0-again.log"]
    processes = [start(env, logs[0], "serve", "--port", str(web_port))]
    processes += [
        start(env, logs[1 + i], "runinferenceworker", "--metrics-port", str(metrics_ports[i])) for i in range(2)
    ]
    url = f"http://127.0.0.1:{web_port}"
    try:
        wait_ready(url, processes, logs[:3])
        _until(lambda: len(_live_workers(url)) == 2, 60, "both workers report in")
        first_token = [threading.Event() for _ in range(6)]
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(_stream, url, key, i, first_token[i]) for i in range(6)]
            for event in first_token:
                assert event.wait(60), "a stream got no token"
            victim = processes[1]
            victim_id = next(w for w in _live_workers(url) if w.split("-")[-2] == str(victim.pid))
            victim.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            _until(
                lambda: victim_id not in _live_workers(url), 10, "/health reports the killed worker gone within 10 s"
            )
            streams = [f.result(timeout=120) for f in futures]
        assert {s.worker for s in streams} == set(_live_workers(url)) | {victim_id}  # requests went to both workers
        for s in streams:
            if s.worker == victim_id:
                assert s.error == "worker_lost" and s.ended_at - killed_at < 10
            else:
                assert not s.error and s.text
        survivor = next(w for w in _live_workers(url))
        with psycopg.connect(env["DATABASE_URL"]) as db:
            rows = db.execute(
                "SELECT request_id, status, error_code, worker FROM usage_usagerecord WHERE endpoint = "
                "'chat.completions'"
            ).fetchall()
        assert len(rows) == 6 and len({r[0] for r in rows}) == 6
        assert sorted((r[1], r[2]) for r in rows if r[3] == victim_id) == [(503, "worker_lost")] * sum(
            s.worker == victim_id for s in streams
        )
        assert all(r[1] == 200 for r in rows if r[3] == survivor)
        survivor_port = metrics_ports[1]
        finished = metric_value(
            metric_samples(f"http://127.0.0.1:{survivor_port}"), "vllm:request_success_total", finished_reason="length"
        )
        assert finished == sum(s.worker == survivor for s in streams)  # the worker's own endpoint counts what it served

        processes.append(start(env, logs[3], "runinferenceworker"))  # the dead worker comes back: no web restart
        _until(lambda: len(_live_workers(url)) == 2, 60, "the restarted worker reports in")
        served_by = set()
        for i in range(6):
            done = _stream(url, key, 100 + i, threading.Event())
            assert not done.error and done.text
            served_by.add(done.worker)
        assert len(served_by) == 2  # the restarted worker takes work again

        for worker in processes[2:]:  # now every worker dies: a new request is refused at once, not after 120 s
            worker.send_signal(signal.SIGKILL)
        _until(lambda: _live_workers(url) == [], 10, "/health reports no worker left within 10 s")
        sent = time.monotonic()
        refused = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "smollm2", "messages": [{"role": "user", "content": "anyone there?"}]},
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        assert refused.status_code == 503 and time.monotonic() - sent < 3
        assert refused.json()["error"]["code"] == "no_worker" and "Retry-After" in refused.headers
        with psycopg.connect(env["DATABASE_URL"]) as db:  # and its usage row says so
            row = db.execute(
                "SELECT status, error_code FROM usage_usagerecord WHERE request_id = %s",
                (refused.headers["x-request-id"],),
            ).fetchall()
        assert row == [(503, "no_worker")]
    finally:
        stop(processes)
        for log in logs:
            if log.exists():
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}")
