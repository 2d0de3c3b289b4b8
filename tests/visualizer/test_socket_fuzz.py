"""Fuzzing the pipeline socket (seeded, bounded): hostile frames of every shape get an error frame or a finished turn,
never a closed socket, a hang or a crash; the socket answers a ping after each one."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from webapp.usage.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)
FRAMES = 120
CHAT = {
    "type": "chat",
    "model": "tiny",
    "messages": [{"role": "user", "content": "the heat is on"}],
    "params": {"temperature": 0, "max_tokens": 4},
}


def _value(rng: random.Random, depth: int = 0) -> Any:
    """Something a careless or hostile client might put anywhere."""
    choices: list[Any] = [
        None,
        True,
        -1,
        0,
        2**70,
        1e308,
        -0.0,
        "",
        "x" * rng.randint(1, 300),
        "<|im_end|>",
        "\u202e\u0000é🇮🇳",
        [],
        {},
        "tiny",
        "summary",
        "full",
        3.5,
    ]
    if depth < 3:
        choices += [
            [_value(rng, depth + 1) for _ in range(rng.randint(1, 3))],
            {rng.choice(["role", "content", "type", "a"]): _value(rng, depth + 1)},
        ]
    return rng.choice(choices)


def _frame(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.15:  # not JSON, or not an object
        return rng.choice(
            [
                " ",
                "{",
                "null",
                "[]",
                '"chat"',
                '{"type": }',
                "\ud800".encode("utf-8", "surrogatepass").decode("latin-1"),
                '{"type": "chat", "messages": [{"role": "user", "content": "\\udc00"}]}',
                "[" * 5000,
                '{"n": ' + "1" * 5000 + "}",
            ]
        )
    frame: dict[str, Any] = json.loads(json.dumps(CHAT))
    frame["params"] = dict(frame["params"])
    for _ in range(rng.randint(1, 3)):
        target = rng.choice(
            ["type", "model", "messages", "params", "level", "step", "conversation", "extra", "param", "message", "ids"]
        )
        if target == "param":
            frame["params"][
                rng.choice(
                    [
                        "temperature",
                        "top_p",
                        "top_k",
                        "max_tokens",
                        "seed",
                        "stop",
                        "logit_bias",
                        "response_format",
                        "n",
                    ]
                )
            ] = _value(rng)
        elif target == "message":
            frame["messages"] = [
                {"role": rng.choice(["user", "system", "assistant", "tool", "robot"]), "content": _value(rng)}
            ]
        elif target == "type":
            frame["type"] = rng.choice(["chat", "inspect", "next", "cancel", "ping", "watch", _value(rng)])
        else:
            frame[target] = _value(rng)
    return json.dumps(frame)


async def _settle(ws: WebsocketCommunicator) -> list[dict[str, Any]]:
    """Ping, then read until the pong has come and any turn the frame started has ended. A turn in step mode waits for
    its student: when it has gone quiet it is cancelled, as the page's Stop button does. (A read that times out
    would kill the app under test, so quiet is asked with `receive_nothing`.)"""
    await ws.send_json_to({"type": "ping"})
    seen: list[dict[str, Any]] = []
    cancelled = False
    while True:
        kinds = [f["type"] for f in seen]
        if "pong" in kinds and ("request" not in kinds or "done" in kinds):
            return seen
        if "pong" in kinds and not cancelled and await ws.receive_nothing(timeout=0.5):
            await ws.send_json_to({"type": "cancel"})
            cancelled = True
        frame = await ws.receive_json_from(timeout=30)
        assert isinstance(frame, dict) and isinstance(frame.get("type"), str)
        seen.append(frame)


def test_hostile_frames_never_close_or_hang_the_socket(with_worker: Any) -> None:
    rng = random.Random(20261203)

    async def body(ws: WebsocketCommunicator) -> None:
        for _ in range(FRAMES):
            sent = _frame(rng)
            await ws.send_to(text_data=sent)
            try:
                seen = await _settle(ws)
            except (TimeoutError, AssertionError) as exc:
                raise AssertionError(f"no complete answer to the frame {sent[:300]!r}") from exc
            errors = [f for f in seen if f["type"] == "error"]
            assert all(isinstance(e["message"], str) and "Traceback" not in e["message"] for e in errors)
        await ws.send_json_to(CHAT)  # and it still serves
        while (await ws.receive_json_from(timeout=30))["type"] != "done":
            pass

    with_worker(body)
    assert not UsageRecord.objects.filter(status__gte=500).exists()
