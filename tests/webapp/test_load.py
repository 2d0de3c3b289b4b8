"""Load on a live server (loopback, bounded): 32 streaming clients at once, a quarter of them leaving mid-stream.

Every client that stays gets exactly the text its request gets alone (greedy, float32), nothing
answers 5xx, every request leaves exactly one usage row, and afterwards the engine is idle.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import pytest
from loops import run_async
from servers import deployment, metric_samples, metric_value

pytestmark = pytest.mark.live  # starts a server of its own

CLIENTS = 32
LEAVING = CLIENTS // 4
MAX_TOKENS = 40


@dataclass
class Outcome:
    request_id: str
    status: int
    text: str
    left: bool


@pytest.fixture(scope="module")
def busy_server(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    models = json.dumps([{"id": "tiny", "path": str(tiny_model_path), "aliases": []}])
    settings = {"ROUNDTRIP_MAX_BATCH": str(CLIENTS), "ROUNDTRIP_MODELS": models}
    with deployment(tmp_path_factory.mktemp("load"), **settings) as served:
        yield served.url, served.key, served.db


def _body(i: int) -> dict[str, object]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"client {i} says the heat is on"}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }


async def _ask(client: httpx.AsyncClient, url: str, key: str, i: int, leave_after: int | None) -> Outcome:
    text = []
    async with client.stream(
        "POST", f"{url}/v1/chat/completions", json=_body(i), headers={"Authorization": f"Bearer {key}"}
    ) as response:
        request_id = response.headers.get("x-request-id", "")
        chunks = 0
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for choice in chunk["choices"]:
                text.append(choice["delta"].get("content") or "")
            chunks += 1
            if leave_after is not None and chunks >= leave_after:
                return Outcome(
                    request_id, response.status_code, "".join(text), True
                )  # closing the stream drops the connection
        return Outcome(request_id, response.status_code, "".join(text), False)


async def _burst(url: str, key: str, plan: dict[int, int | None]) -> list[Outcome]:
    limits = httpx.Limits(max_connections=CLIENTS + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(*(_ask(client, url, key, i, plan[i]) for i in range(CLIENTS)))


def test_32_streams_at_once_each_get_their_own_answer_and_leave_one_usage_row(
    busy_server: tuple[str, str, Path],
) -> None:
    url, key, db = busy_server
    rng = random.Random(7)
    leavers = set(rng.sample(range(CLIENTS), LEAVING))
    plan = {i: (rng.randint(1, MAX_TOKENS // 2) if i in leavers else None) for i in range(CLIENTS)}
    alone = {i: run_async(_burst_one(url, key, i)).text for i in range(CLIENTS) if i not in leavers}
    started = time.monotonic()
    outcomes = run_async(_burst(url, key, plan))
    assert time.monotonic() - started < 120
    for i, outcome in enumerate(outcomes):
        assert outcome.status == 200
        if i not in leavers:
            assert outcome.text == alone[i], f"client {i}"
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT request_id, status FROM usage_usagerecord").fetchall()
    ids = [r[0] for r in rows]
    burst_ids = [o.request_id for o in outcomes]
    assert all(ids.count(rid) == 1 for rid in burst_ids)  # exactly one row for every request of the burst
    statuses = dict(rows)
    assert {statuses[o.request_id] for o in outcomes if not o.left} == {200}
    assert all(
        statuses[o.request_id] in (200, 499) for o in outcomes if o.left
    )  # a fast stream may have finished first
    assert sum(statuses[o.request_id] == 499 for o in outcomes if o.left) >= LEAVING // 2
    assert not [s for s in statuses.values() if s >= 500]
    deadline = time.monotonic() + 10
    while True:  # the engine notices the last departures at its next step
        found = metric_samples(url)
        if (
            metric_value(found, "vllm:num_requests_running") == 0
            and metric_value(found, "vllm:num_requests_waiting") == 0
        ):
            break
        assert time.monotonic() < deadline, "the engine did not go idle"
        time.sleep(0.2)
    assert metric_value(found, "vllm:request_success_total", finished_reason="abort") >= 1


async def _burst_one(url: str, key: str, i: int) -> Outcome:
    async with httpx.AsyncClient(timeout=120) as client:
        return await _ask(client, url, key, i, None)
