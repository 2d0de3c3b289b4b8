"""The default deployment: SmolLM2 and Gemma 3 270M served together by one process (`make run`), each with its own
scheduler, chosen by `model` on the API; both answer at once, each as it answers alone."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from loops import run_async
from servers import Deployment, default_deployment

pytestmark = pytest.mark.live  # starts a server of its own

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "llamacpp-gemma3-270m.json"


@pytest.fixture(scope="module")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with default_deployment(tmp_path_factory.mktemp("two-models")) as deployment:
        yield deployment


def test_both_models_are_listed_and_ready(default_server: Deployment) -> None:
    url, key = default_server.url, default_server.key
    listed = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
    assert {m["id"] for m in listed["data"]} >= {"smollm2-135m-instruct", "gemma3-270m"}
    health = httpx.get(f"{url}/health").json()
    assert health["models"]["gemma3-270m"]["state"] == "ready"


def test_both_answer_at_once_as_each_answers_alone(default_server: Deployment) -> None:
    """A Gemma completion (greedy: llama.cpp's first tokens on the shared reference) and a SmolLM2 chat, streamed at
    the same time; each leaves a usage row naming its model."""
    url, key, db = default_server.url, default_server.key, default_server.db
    case = json.loads(REFERENCE.read_text())["greedy"][0]  # "The capital of India is"
    gemma = {"model": "gemma", "prompt": case["prompt"], "max_tokens": 8, "temperature": 0, "stream": True}
    smollm2 = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "What's the capital of India?"}],
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
    }

    async def stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> str:
        parts = []
        async with client.stream("POST", f"{url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"]
                    if choice:
                        parts.append(choice[0].get("text") or choice[0].get("delta", {}).get("content") or "")
        return "".join(parts)

    async def both() -> list[str]:
        async with httpx.AsyncClient(timeout=120) as client:
            return list(
                await asyncio.gather(
                    stream(client, "/v1/completions", gemma), stream(client, "/v1/chat/completions", smollm2)
                )
            )

    together = run_async(both())
    assert together[0] == " the capital of the state of Uttar Pradesh"  # llama.cpp's first 8 tokens
    assert "New Delhi" in together[1]
    with sqlite3.connect(db) as rows:
        models = {m for (m,) in rows.execute("SELECT model FROM usage_usagerecord")}
    assert {"gemma3-270m", "smollm2-135m-instruct"} <= models


def test_the_served_process_holds_both_models_in_bounded_memory(default_server: Deployment) -> None:
    """Peak resident memory of the one process serving both (weights 116 MB + 395 MB, KV caches, the web side)."""
    pid = default_server.pid
    status = Path(f"/proc/{pid}/status").read_text()
    peak_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))
    print(f"served RSS peak with both models: {peak_kb / 1024:.0f} MB")
    assert peak_kb < 2 * 1024 * 1024
