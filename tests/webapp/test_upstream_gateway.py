"""The gateway in front of other servers, with real servers only: three Roundtrip servers on a tiny model are the
upstreams of a fourth, the gateway, which routes models to them by ROUNDTRIP_MODELS entries with a `url`.

- "solo" is server A alone; "far" is A and B as replicas; "strict" is A through a key limited to one request a minute
  (so A answers 429), "busy" is C (no queue: it answers 503 overloaded to every request) and "dead" is a port nobody
  listens on, each falling back to "solo-b" (B); "dead-to-local" falls back to "here", which the gateway runs itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest
from loops import run_async
from servers import (
    Deployment,
    clear_of_minute_edge,
    deployment,
    free_port,
    manage,
    metric_samples,
    metric_value,
    server_env,
)
from tiny_gguf import TinySpec, write_tiny_gguf

pytestmark = pytest.mark.live  # starts servers of its own

LONG = 6000  # tokens: a stream that runs for seconds on the tiny model


@dataclass
class Fleet:
    a: Deployment
    b: Deployment
    c: Deployment
    gateway: Deployment

    def upstream_name(self, model: str, server: Deployment) -> str:
        return f"{model}@{server.url.removeprefix('http://')}"


def _models(path: Path) -> str:
    return json.dumps([{"id": "tiny", "path": str(path), "aliases": []}])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    model = write_tiny_gguf(tmp_path_factory.mktemp("upstream-model") / "tiny.gguf", TinySpec(context_length=8192))
    local = {"ROUNDTRIP_MODELS": _models(model)}
    with (
        deployment(tmp_path_factory.mktemp("a"), **local) as a,
        deployment(tmp_path_factory.mktemp("b"), **local) as b,
        deployment(tmp_path_factory.mktemp("c"), **local, ROUNDTRIP_MAX_QUEUED="0") as c,
    ):
        limited = manage(
            server_env(ROUNDTRIP_SQLITE_PATH=str(a.db)), "createapikey", "limited", "--rpm", "1", "--tpm", "0"
        )
        keys = {"KEY_A": a.key, "KEY_B": b.key, "KEY_C": c.key, "KEY_A_LIMITED": limited.strip().split()[-1]}

        def entry(model_id: str, server: Deployment | str, key: str = "", **more: Any) -> dict[str, Any]:
            url = server if isinstance(server, str) else f"{server.url}/v1"
            return {
                "id": model_id,
                "url": url,
                "upstream_model": "tiny",
                **({"api_key_env": key} if key else {}),
                **more,
            }

        models = [
            entry("solo", a, "KEY_A", aliases=["solo-alias"]),
            entry("far", a, "KEY_A"),
            entry("far", b, "KEY_B"),
            entry("solo-b", b, "KEY_B"),
            entry("strict", a, "KEY_A_LIMITED", fallback=["solo-b"]),
            entry("busy", c, "KEY_C", fallback=["solo-b"]),
            entry("dead", f"http://127.0.0.1:{free_port()}/v1", fallback=["solo-b"]),
            entry("dead-to-local", f"http://127.0.0.1:{free_port()}/v1", fallback=["here"]),
            {"id": "here", "path": str(model), "aliases": []},  # a model the gateway runs itself
        ]
        settings = {
            **keys,
            "ROUNDTRIP_MODELS": json.dumps(models),
            "ROUNDTRIP_UPSTREAM_COOLDOWN": "30",
            "ROUNDTRIP_UPSTREAM_PROBE_SECONDS": "1",
            "ROUNDTRIP_UPSTREAM_TIMEOUT": "20",
        }
        with deployment(tmp_path_factory.mktemp("gateway"), **settings) as gateway:
            yield Fleet(a, b, c, gateway)


def _chat(model: str, content: str, max_tokens: int = 24, stream: bool = True, **more: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0}
    body |= {"max_tokens": max_tokens, "stream": stream, **more}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


@dataclass
class Streamed:
    status: int
    headers: dict[str, str]
    text: str
    usage: dict[str, Any] | None
    errors: list[dict[str, Any]]
    timings: dict[str, Any]
    done: bool


def _stream(server: Deployment, body: dict[str, Any], path: str = "chat/completions") -> Streamed:
    text: list[str] = []
    usage: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = []
    timings: dict[str, Any] = {}
    done = False
    with httpx.stream(
        "POST", f"{server.url}/v1/{path}", json=body, headers={"Authorization": f"Bearer {server.key}"}, timeout=60
    ) as response:
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    errors.append(chunk["error"])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", []):
                    text.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
                    timings = choice.get("roundtrip_timings") or timings
                timings = chunk.get("roundtrip_timings") or timings
        return Streamed(response.status_code, dict(response.headers), "".join(text), usage, errors, timings, done)


def _rows(db: Path, request_id: str | None = None) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as connection:
        connection.row_factory = sqlite3.Row
        query = "SELECT * FROM usage_usagerecord" + (" WHERE request_id = ?" if request_id else "") + " ORDER BY id"
        return [dict(r) for r in connection.execute(query, (request_id,) if request_id else ())]


def _generations(db: Path) -> list[dict[str, Any]]:
    return [r for r in _rows(db) if r["endpoint"] == "chat.completions"]


def _counts(usage: dict[str, Any] | None) -> tuple[int, int]:
    assert usage is not None
    return usage["prompt_tokens"], usage["completion_tokens"]


def test_a_stream_through_the_gateway_is_the_upstreams_own(fleet: Fleet) -> None:
    asked = "tell me about the heat in the city"
    direct = _stream(fleet.a, _chat("tiny", asked))
    through = _stream(fleet.gateway, _chat("solo-alias", asked))
    assert through.status == 200 and through.done and not through.errors
    assert through.text == direct.text and through.text
    assert _counts(through.usage) == _counts(direct.usage)
    assert through.timings["upstream"] == fleet.upstream_name("solo", fleet.a)
    assert through.timings["gateway_request_ms"] >= 0 and through.timings["upstream_ttft_ms"] > 0
    (row,) = _rows(fleet.gateway.db, through.headers["x-request-id"])
    assert (row["status"], row["model"], row["worker"]) == (200, "solo", fleet.upstream_name("solo", fleet.a))
    assert (row["prompt_tokens"], row["completion_tokens"]) == _counts(direct.usage)
    assert row["ttft_ms"] is not None


def _chunks(server: Deployment, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]], bool]:
    """(request id, every streamed chunk, whether [DONE] ended the stream)."""
    headers = {"Authorization": f"Bearer {server.key}"}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=60) as response:
        lines = list(response.iter_lines())
        request_id = response.headers["x-request-id"]
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    return request_id, chunks, lines[-2:] == ["data: [DONE]", ""] or lines[-1:] == ["data: [DONE]"]


def _content(chunks: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """The streamed text, and the tokens its log-probabilities name."""
    text, tokens = [], []
    for chunk in chunks:
        for choice in chunk["choices"]:
            text.append(choice["delta"].get("content") or "")
            tokens += [entry["token"] for entry in (choice.get("logprobs") or {}).get("content") or []]
    return "".join(text), tokens


def test_a_streamed_chat_answer_is_the_upstreams_chunks_under_the_gateways_envelope(fleet: Fleet) -> None:
    asked = "name three rivers"
    body = _chat("solo", asked, max_tokens=12, logprobs=True, top_logprobs=2)
    del body["stream_options"]  # no usage chunk asked for
    _, direct, _ = _chunks(fleet.a, body | {"model": "tiny"})
    request_id, through, done = _chunks(fleet.gateway, body)
    assert done
    assert _content(through) == _content(direct) and _content(through)[1]
    assert {(c["id"], c["model"], c["object"]) for c in through} == {(request_id, "solo", "chat.completion.chunk")}
    assert all(
        set(c) <= {"id", "object", "created", "model", "system_fingerprint", "choices", "roundtrip_timings"}
        for c in through
    )  # the upstream's own extras stay behind
    assert all(c["choices"] for c in through)  # no usage chunk: the client did not ask for one
    *tokens, last = through
    assert all(choice["finish_reason"] is None for c in tokens for choice in c["choices"])
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["roundtrip_timings"]["upstream"] == fleet.upstream_name("solo", fleet.a)
    (row,) = _rows(fleet.gateway.db, request_id)
    assert (row["status"], row["completion_tokens"]) == (200, 12)


def test_whole_answers_and_text_completions_are_the_upstreams_own(fleet: Fleet) -> None:
    headers_a = {"Authorization": f"Bearer {fleet.a.key}"}
    headers_g = {"Authorization": f"Bearer {fleet.gateway.key}"}
    direct = httpx.post(
        f"{fleet.a.url}/v1/chat/completions", json=_chat("tiny", "a whole one", stream=False), headers=headers_a
    ).json()
    through = httpx.post(
        f"{fleet.gateway.url}/v1/chat/completions", json=_chat("solo", "a whole one", stream=False), headers=headers_g
    ).json()
    assert through["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    assert through["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"]
    prompt = {"prompt": "the heat is", "max_tokens": 16, "temperature": 0}
    text_direct = _stream(fleet.a, {"model": "tiny", "stream": True, **prompt}, "completions")
    text_through = _stream(fleet.gateway, {"model": "solo", "stream": True, **prompt}, "completions")
    assert text_through.text == text_direct.text and text_through.text


def test_the_anthropic_and_responses_apis_reach_an_upstream_model(fleet: Fleet) -> None:
    headers = {"Authorization": f"Bearer {fleet.gateway.key}"}
    message = httpx.post(
        f"{fleet.gateway.url}/v1/messages",
        json={"model": "solo", "max_tokens": 12, "messages": [{"role": "user", "content": "hi"}]},
        headers=headers,
    )
    assert message.status_code == 200 and message.json()["usage"]["output_tokens"] > 0
    response = httpx.post(
        f"{fleet.gateway.url}/v1/responses",
        json={"model": "solo", "input": "hi", "max_output_tokens": 12},
        headers=headers,
    )
    assert response.status_code == 200 and response.json()["output"][0]["content"][0]["text"]


def test_the_openai_and_anthropic_sdks_stream_an_upstream_model(fleet: Fleet) -> None:
    openai_client = openai.OpenAI(base_url=f"{fleet.gateway.url}/v1", api_key=fleet.gateway.key)
    direct = openai.OpenAI(base_url=f"{fleet.a.url}/v1", api_key=fleet.a.key)
    asked: list[Any] = [{"role": "user", "content": "the sdk asks"}]
    pieces = [
        chunk.choices[0].delta.content or ""
        for chunk in openai_client.chat.completions.create(
            model="solo", messages=asked, max_tokens=16, temperature=0, stream=True
        )
        if chunk.choices
    ]
    theirs = direct.chat.completions.create(model="tiny", messages=asked, max_tokens=16, temperature=0)
    assert "".join(pieces) == theirs.choices[0].message.content
    claude = anthropic.Anthropic(base_url=fleet.gateway.url, api_key=fleet.gateway.key)
    hi: list[Any] = [{"role": "user", "content": "hi"}]
    # greedy, as above: a sampled answer of the tiny model may end at its first token, with no text
    with claude.messages.stream(model="solo", max_tokens=16, messages=hi, extra_body={"temperature": 0}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    theirs = direct.chat.completions.create(model="tiny", messages=hi, max_tokens=16, temperature=0)
    assert text and text == theirs.choices[0].message.content
    assert 0 < final.usage.output_tokens <= 16 and final.usage.input_tokens > 0


def test_two_replicas_share_the_load(fleet: Fleet) -> None:
    async def burst() -> list[str]:
        async with httpx.AsyncClient(timeout=60) as client:

            async def one(i: int) -> str:
                body = _chat("far", f"request {i}", max_tokens=200, ignore_eos=True)
                headers = {"Authorization": f"Bearer {fleet.gateway.key}"}
                async with client.stream(
                    "POST", f"{fleet.gateway.url}/v1/chat/completions", json=body, headers=headers
                ) as r:
                    async for _ in r.aiter_lines():
                        pass
                    return r.headers["x-roundtrip-worker"]

            return await asyncio.gather(*(one(i) for i in range(8)))

    servers = run_async(burst())
    a, b = fleet.upstream_name("far", fleet.a), fleet.upstream_name("far", fleet.b)
    assert set(servers) == {a, b}
    assert min(servers.count(a), servers.count(b)) >= 3, servers


def test_an_upstream_answering_429_before_the_first_byte_sends_the_request_to_the_fallback(fleet: Fleet) -> None:
    clear_of_minute_edge()
    first = _stream(fleet.gateway, _chat("strict", "one"))
    second = _stream(fleet.gateway, _chat("strict", "two"))  # the key's one request a minute is spent: A says 429
    assert first.status == second.status == 200 and not second.errors and second.text
    assert first.timings["upstream"] == fleet.upstream_name("strict", fleet.a)
    assert second.timings["upstream"] == fleet.upstream_name("solo-b", fleet.b)
    assert "HTTP 429" in second.timings["retried"][0]
    (row,) = _rows(fleet.gateway.db, second.headers["x-request-id"])
    assert (row["status"], row["model"], row["worker"]) == (200, "strict", fleet.upstream_name("solo-b", fleet.b))


def test_an_upstream_answering_503_or_refusing_connections_sends_the_request_to_the_fallback(fleet: Fleet) -> None:
    busy = _stream(fleet.gateway, _chat("busy", "anyone there?"))  # C has no room: 503 overloaded to everything
    assert busy.status == 200 and busy.text and not busy.errors
    assert busy.timings["upstream"] == fleet.upstream_name("solo-b", fleet.b)
    assert "HTTP 503" in busy.timings["retried"][0]
    dead = _stream(fleet.gateway, _chat("dead", "hello?"))
    assert dead.status == 200 and dead.timings["upstream"] == fleet.upstream_name("solo-b", fleet.b)
    assert "could not connect" in dead.timings["retried"][0]


def test_when_every_upstream_server_fails_a_local_fallback_answers(fleet: Fleet) -> None:
    asked = "nobody upstream"
    through = _stream(fleet.gateway, _chat("dead-to-local", asked))
    here = _stream(fleet.gateway, _chat("here", asked))
    assert through.status == 200 and not through.errors and through.text == here.text
    assert "@" not in through.headers["x-roundtrip-worker"]  # an inference worker of the gateway, not a server
    (row,) = _rows(fleet.gateway.db, through.headers["x-request-id"])
    assert (row["status"], row["model"]) == (200, "dead-to-local")


def test_a_client_that_leaves_stops_the_upstream(fleet: Fleet) -> None:
    before = len(_generations(fleet.a.db))
    body = _chat("solo", "go on and on", max_tokens=LONG, ignore_eos=True)
    headers = {"Authorization": f"Bearer {fleet.gateway.key}"}
    url = f"{fleet.gateway.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as response:
        request_id = response.headers["x-request-id"]
        for n, _ in enumerate(response.iter_lines()):
            if n > 20:
                break  # closing the stream drops the connection
    # The gateway stops the upstream first, then writes its own row: wait for both, each in its own database.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (
        _generations(fleet.a.db)[before:] and _rows(fleet.gateway.db, request_id)
    ):
        time.sleep(0.2)
    (upstream_row,) = _generations(fleet.a.db)[before:]  # the upstream's own usage row: its client (the gateway) left
    assert upstream_row["status"] == 499 and upstream_row["completion_tokens"] < LONG
    (row,) = _rows(fleet.gateway.db, request_id)
    assert row["status"] == 499


def test_health_models_tokenize_and_metrics_show_each_upstream(fleet: Fleet) -> None:
    health = httpx.get(f"{fleet.gateway.url}/health").json()
    far = health["models"]["far"]
    assert far["state"] == "ready"
    assert {s["name"] for s in far["upstream"]} == {
        fleet.upstream_name("far", fleet.a),
        fleet.upstream_name("far", fleet.b),
    }
    assert health["models"]["dead"]["state"] == "unavailable"
    assert not [r for r in _rows(fleet.a.db) if r["endpoint"] == "models"]  # probes ask /health, which logs nothing
    assert health["models"]["dead"]["upstream"][0]["last_error"]
    headers = {"Authorization": f"Bearer {fleet.gateway.key}"}
    listed = {m["id"]: m for m in httpx.get(f"{fleet.gateway.url}/v1/models", headers=headers).json()["data"]}
    assert listed["solo"]["status"]["upstream"][0]["state"] == "up"
    text = {"text": "the heat is on"}
    ours = httpx.post(f"{fleet.gateway.url}/v1/tokenize", json={"model": "solo", **text}, headers=headers).json()
    theirs = httpx.post(
        f"{fleet.a.url}/v1/tokenize", json={"model": "tiny", **text}, headers={"Authorization": f"Bearer {fleet.a.key}"}
    ).json()
    assert ours["ids"] == theirs["ids"] and ours["tokens"] == theirs["tokens"]
    back = httpx.post(
        f"{fleet.gateway.url}/v1/detokenize", json={"model": "solo", "tokens": ours["ids"]}, headers=headers
    )
    assert back.json()["text"] == "the heat is on"
    samples = metric_samples(fleet.gateway.url)
    solo = fleet.upstream_name("solo", fleet.a)
    assert metric_value(samples, "roundtrip_upstream_time_to_first_token_seconds_count", upstream=solo) > 0
    assert metric_value(samples, "roundtrip_upstream_gateway_chunk_seconds_count", upstream=solo) > 0
    assert metric_value(samples, "roundtrip_upstream_requests_total", upstream=solo, outcome="ok") > 0
    assert (
        metric_value(samples, "roundtrip_upstream_retries_total", upstream=fleet.upstream_name("strict", fleet.a)) >= 1
    )


def test_a_replica_killed_mid_stream_ends_its_streams_with_an_error_and_the_other_takes_new_requests(
    fleet: Fleet,
) -> None:
    """Last in this module: B does not come back."""
    results: dict[int, Streamed] = {}
    started = threading.Barrier(7)

    def one(i: int) -> None:
        body = _chat("far", f"long {i}", max_tokens=LONG, ignore_eos=True)
        text, errors, done = [], [], False
        headers = {"Authorization": f"Bearer {fleet.gateway.key}"}
        with httpx.stream(
            "POST", f"{fleet.gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=60
        ) as r:
            waited = False
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    errors += [chunk["error"]] if "error" in chunk else []
                    text += [c["delta"].get("content") or "" for c in chunk.get("choices", [])]
                    if not waited:
                        waited = True
                        started.wait(30)
                    if len(text) > 400 and r.headers["x-roundtrip-worker"].endswith(fleet.a.url.rsplit(":", 1)[1]):
                        break  # A's streams leave once B has been killed and seen to fail
                done = done or line == "data: [DONE]"
            results[i] = Streamed(r.status_code, dict(r.headers), "".join(text), None, errors, {}, done)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    started.wait(30)
    killed = time.monotonic()
    os.kill(fleet.b.pid, signal.SIGKILL)
    for thread in threads:
        thread.join(30)
    ended = time.monotonic() - killed
    on_b = [r for r in results.values() if r.headers["x-roundtrip-worker"] == fleet.upstream_name("far", fleet.b)]
    assert len(results) == 6 and on_b
    for streamed in on_b:
        assert streamed.errors and streamed.errors[0]["code"] == "upstream_error" and streamed.done
    assert ended < 10
    after = [_stream(fleet.gateway, _chat("far", f"after {i}")) for i in range(4)]
    assert all(r.status == 200 and not r.errors for r in after)
    assert {r.headers["x-roundtrip-worker"] for r in after} == {fleet.upstream_name("far", fleet.a)}
    time.sleep(1)  # the rows of the streams that left are written as they settle
    for streamed in [*results.values(), *after]:
        rows = _rows(fleet.gateway.db, streamed.headers["x-request-id"])
        assert len(rows) == 1
    for streamed in on_b:
        assert _rows(fleet.gateway.db, streamed.headers["x-request-id"])[0]["status"] == 502
