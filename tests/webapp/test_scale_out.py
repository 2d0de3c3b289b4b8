"""The grown-up set-up: PostgreSQL, Redis, two Daphne processes and a separate inference worker.

Same code, other settings: the channel layer and the rate-limit counters live in Redis,
usage rows in PostgreSQL, and the model in its own `runinferenceworker` process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import httpx2 as httpx
import psycopg
import pytest
from openai import OpenAI

from servers import clear_of_minute_edge, free_port, manage, start, stop, wait_ready

HI = [{"role": "user", "content": "the heat is on"}]


@pytest.fixture
def cluster(postgres_url: str, redis_url: str, tiny_model_path: Path, tmp_path: Path) -> Iterator[tuple[list[str], dict[str, str], list[Path]]]:
    env = {
        **os.environ,
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


def test_two_web_processes_share_one_worker_the_limits_and_the_database(cluster: tuple[list[str], dict[str, str], list[Path]]) -> None:
    urls, env, logs = cluster
    key = manage(env, "createapikey", "cluster", "--rpm", "3").strip()
    clear_of_minute_edge()
    answers = []
    for url in urls:
        stream = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0).chat.completions.create(
            model="tiny", messages=HI, temperature=1.0, seed=5, max_tokens=12, stream=True  # type: ignore[arg-type]
        )
        answers.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
    assert answers[0] == answers[1] != ""  # same seed, either web process, the one worker
    third = httpx.post(f"{urls[0]}/v1/chat/completions", json={"model": "tiny", "messages": HI, "max_tokens": 2}, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    fourth = httpx.post(f"{urls[1]}/v1/chat/completions", json={"model": "tiny", "messages": HI, "max_tokens": 2}, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert (third.status_code, fourth.status_code) == (200, 429)  # one Redis counter for both processes
    with psycopg.connect(env["DATABASE_URL"]) as db:
        rows = db.execute("SELECT status, finish_reason, completion_tokens FROM usage_usagerecord ORDER BY id").fetchall()
    assert rows == [(200, "length", 12), (200, "length", 12), (200, "length", 2), (429, "error", 0)]
