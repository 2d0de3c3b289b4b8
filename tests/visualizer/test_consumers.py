"""The pipeline socket's protocol, driven with Channels' WebsocketCommunicator against a real worker (tiny model)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from visualizer.consumers import MAX_BATCH_BYTES, PipelineConsumer
from visualizer.models import Conversation
from webapp.usage.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)
CHAT = {
    "type": "chat",
    "model": "tiny",
    "messages": [{"role": "user", "content": "the heat is on"}],
    "params": {"temperature": 0, "max_tokens": 4},
}


async def _until(communicator: WebsocketCommunicator, kind: str, wait: float = 30) -> list[dict[str, Any]]:
    frames = []
    while True:
        frame = await communicator.receive_json_from(timeout=wait)
        frames.append(frame)
        if frame["type"] == kind:
            return frames


def test_a_turn_sends_every_stage_in_order(with_worker: Any) -> None:
    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_json_to(CHAT)
        frames = await _until(ws, "done")
        kinds = [f["type"] for f in frames]
        assert kinds[:3] == ["request", "gateway", "accepted"] and kinds[-2:] == ["usage", "done"]
        events = [f["event"]["event"] for f in frames if f["type"] == "trace"]
        assert events[:4] == ["tokenized", "context", "batch", "forward"] and events[-1] == "finished"
        assert frames[2]["worker"]  # the page can say which worker took the turn
        batch = next(f["event"] for f in frames if f["type"] == "trace" and f["event"]["event"] == "batch")
        assert batch["batch_size"] == 1 and batch["requests"] == [frames[0]["request_id"]]
        gateway = frames[1]
        assert [s["name"] for s in gateway["stages"]] == ["authenticate", "rate_limit", "route"] and gateway[
            "model"
        ] == "tiny"
        finished = next(f["event"] for f in frames if f["type"] == "trace" and f["event"]["event"] == "finished")
        sampled = [f["event"] for f in frames if f["type"] == "trace" and f["event"]["event"] == "sampled"]
        assert len(sampled) == 4 and all(s["detail"]["candidates"] for s in sampled)
        assert frames[-2]["record"]["completion_tokens"] == finished["completion_tokens"] == 4

    with_worker(body)
    assert UsageRecord.objects.get(endpoint="ws.chat").status == 200
    assert Conversation.objects.get().thread()[0].content == "the heat is on"


def test_full_level_sends_bounded_attention(with_worker: Any) -> None:
    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_json_to({**CHAT, "level": "full"})
        frames = await _until(ws, "done")
        forward = next(f["event"] for f in frames if f["type"] == "trace" and f["event"]["event"] == "forward")
        attention = forward["detail"]["attention"]
        assert attention["shape"][:2] == [2, 4] and attention["shape"][2] == forward["kv_length"]
        assert len(forward["detail"]["logit_lens"]) == 2 and len(forward["detail"]["residual_norms"]) == 3
        detail = forward["detail"]  # both halves of each layer, as the page draws them
        assert len(detail["attention_update_norms"]) == len(detail["feed_forward_update_norms"]) == 2
        assert [g["layer"] for g in detail["logit_lens_after_attention"]] == [0, 1] and detail[
            "logit_lens_after_attention"
        ][0]["token"]
        assert [len(layer) for layer in detail["top_neurons"]] == [8, 8] and set(detail["top_neurons"][0][0]) == {
            "index",
            "gate",
            "up",
            "activation",
        }
        context = next(f["event"] for f in frames if f["type"] == "trace" and f["event"]["event"] == "context")
        # the tiny model's: positions shown with its own numbers
        assert context["rope_base"] == 10000.0 and context["rope_dim"] == 16

    with_worker(body)


def test_step_mode_sends_one_token_per_next(with_worker: Any) -> None:
    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_json_to({**CHAT, "step": True})
        frames = await _until(ws, "trace")
        while not (frames[-1]["type"] == "trace" and frames[-1]["event"]["event"] == "text"):
            frames.append(await ws.receive_json_from(timeout=10))
        first_text = frames[-1]["event"]["text"]
        assert await ws.receive_nothing(timeout=0.3)
        await ws.send_json_to({"type": "next"})
        frame = await ws.receive_json_from(timeout=10)
        while not (frame["type"] == "trace" and frame["event"]["event"] == "text"):
            frame = await ws.receive_json_from(timeout=10)
        assert frame["event"]["step"] == 2
        so_far = first_text + frame["event"]["text"]
        assert await ws.receive_nothing(timeout=0.3)
        await ws.send_json_to({"type": "cancel"})
        frames = await _until(ws, "done")
        assert frames[-2]["type"] == "usage" and frames[-2]["record"]["finish_reason"] == "cancelled", frames[-4:]
        # stopped: kept with the text it had, and said so
        texts = "".join(f["event"]["text"] for f in frames if f["type"] == "trace" and f["event"]["event"] == "text")
        answer = frames[-1]["answer"]
        assert answer["finish_reason"] == "stopped" and answer["completion_tokens"] == 2 and answer["content"]
        assert answer["content"] == so_far + texts

    with_worker(body)


def test_a_kept_turn_goes_where_the_frame_says(with_worker: Any) -> None:
    """A new exchange, then another answer to the same question, then more of that answer: the done frames say what
    was kept, and the conversation's thread agrees."""

    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_json_to(CHAT)
        first = (await _until(ws, "done"))[-1]
        question, answer, cid = first["question"], first["answer"], first["conversation"]
        assert question["content"] == "the heat is on" and answer["parent"] == question["id"]
        assert first["current"] == answer["id"] and answer["finish_reason"] == "length"
        await ws.send_json_to(
            {
                **CHAT,
                "params": {"temperature": 1, "seed": 3, "max_tokens": 4},
                "conversation": cid,
                "answer_to": question["id"],
            }
        )
        again = (await _until(ws, "done"))[-1]
        assert again["question"]["id"] == question["id"] and again["answer"]["id"] != answer["id"]
        history = [*CHAT["messages"], {"role": "assistant", "content": again["answer"]["content"]}]
        await ws.send_json_to(
            {
                **CHAT,
                "messages": history,
                "continue_final_message": True,
                "conversation": cid,
                "extend": again["answer"]["id"],
            }
        )
        more = (await _until(ws, "done"))[-1]
        assert more["answer"]["id"] == again["answer"]["id"] and more["answer"]["completion_tokens"] == 8
        assert more["answer"]["content"].startswith(again["answer"]["content"])
        assert len(more["answer"]["content"]) > len(again["answer"]["content"])

    with_worker(body)
    conversation = Conversation.objects.get()
    shown = [m.role for m in conversation.thread()]
    assert shown == ["user", "assistant"] and conversation.messages.count() == 3


def test_stop_before_the_worker_takes_the_turn_still_stops_it(with_worker: Any) -> None:
    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_json_to({**CHAT, "step": True})  # paused after its first token, so only Stop can end it
        await ws.send_json_to({"type": "cancel"})
        frames = await _until(ws, "done")
        assert not any(f["type"] == "error" for f in frames), frames
        answer = frames[-1]["answer"]
        assert answer["finish_reason"] == "stopped" and answer["completion_tokens"] <= 1

    with_worker(body)


@pytest.mark.parametrize(
    "raw, code",
    [
        ("not json", "bad_message"),
        ("[1, 2]", "bad_message"),
        (json.dumps({"type": "dance"}), "unknown_type"),
        (json.dumps({"type": "chat", "text": "x" * 70000}), "frame_too_large"),
        ("[" * 20000 + "]" * 20000, "bad_message"),  # nesting beyond the parser's recursion limit
        ('{"type": "chat", "n": ' + "9" * 5001 + "}", "bad_message"),  # beyond Python's integer digit limit
        ('{"type": "chat", "x": NaN}', "bad_message"),
        ('{"type": "chat", "messages": [{"role": "user", "content": "\\ud800"}]}', "bad_message"),  # a lone surrogate
        (
            json.dumps({"type": "inspect", "model": "tiny", "ids": 5}),
            "invalid_request_error",
        ),  # once a TypeError that killed the socket
    ],
)
def test_malformed_frames_get_an_error_frame_and_the_socket_stays_open(with_worker: Any, raw: str, code: str) -> None:
    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_to(text_data=raw)
        frame = await ws.receive_json_from()
        assert frame["type"] == "error" and (frame["code"] or "invalid_request_error") == code
        await ws.send_json_to({"type": "ping"})
        assert (await ws.receive_json_from())["type"] == "pong"

    with_worker(body)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"messages": []}, "at least one message"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"model": "nope"}, "does not exist"),
        ({"params": {"temperature": 9}}, "temperature"),
        ({"level": "everything"}, "level"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_chat_frames_get_the_gateways_error(with_worker: Any, change: dict[str, Any], words: str) -> None:
    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_json_to({**CHAT, **change})
        frames = await _until(ws, "done")
        error = next(f for f in frames if f["type"] == "error")
        assert words in error["message"]
        assert frames[-2]["type"] == "usage" and frames[-2]["record"]["status"] in (400, 404)

    with_worker(body)


def test_model_text_stays_text_in_frames(with_worker: Any) -> None:
    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_json_to({**CHAT, "messages": [{"role": "user", "content": "<img src=x onerror=alert(1)>"}]})
        frames = await _until(ws, "done")
        tokenized = next(f["event"] for f in frames if f["type"] == "trace" and f["event"]["event"] == "tokenized")
        assert "<img src=x onerror=alert(1)>" in tokenized["text"]

    with_worker(body)


def test_the_page_can_ask_for_full_detail_after_the_fact(with_worker: Any) -> None:
    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_json_to({"type": "inspect", "model": "tiny", "ids": [1, 50, 60, 70], "step": 2})
        frame = await ws.receive_json_from(timeout=30)
        assert frame["type"] == "inspection" and frame["step"] == 2
        assert frame["detail"]["attention"]["shape"] == [2, 4, 4] and len(frame["detail"]["logit_lens"]) == 2
        await ws.send_json_to({"type": "inspect", "model": "tiny", "ids": [1, 99999]})
        error = await ws.receive_json_from(timeout=30)
        assert error["type"] == "error" and "'ids'" in error["message"]

    with_worker(body)


def test_the_page_can_ask_for_the_prompts_full_attention_matrix(with_worker: Any) -> None:
    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_json_to({"type": "prompt_attention", "model": "tiny", "ids": [1, 50, 60, 70, 80], "layer": 1})
        frame = await ws.receive_json_from(timeout=30)
        assert frame["type"] == "prompt_attention" and frame["layer"] == 1
        assert frame["attention"]["shape"] == [4, 5, 5] and frame["attention"]["positions"] == [0, 1, 2, 3, 4]
        for layer, words in ((2, "'layer' must be 0 to 1"), ("top", "Invalid type for 'layer': expected an integer")):
            await ws.send_json_to({"type": "prompt_attention", "model": "tiny", "ids": [1, 50], "layer": layer})
            error = await ws.receive_json_from(timeout=30)
            assert error["type"] == "error" and words in error["message"]

    with_worker(body)
    assert list(
        UsageRecord.objects.filter(endpoint="ws.prompt_attention").order_by("id").values_list("status", flat=True)
    ) == [200, 400, 400]


def test_the_page_can_ask_what_if_a_step_had_been_sampled_otherwise(with_worker: Any) -> None:
    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_json_to(CHAT)
        frames = await _until(ws, "done")
        events = [f["event"] for f in frames if f["type"] == "trace"]
        prompt = next(e["ids"] for e in events if e["event"] == "tokenized")
        run = [e["token_id"] for e in events if e["event"] == "sampled"]
        last = len(run)  # the last step, drawn again after the tokens before it
        question = {"type": "resample", "model": "tiny", "prompt_ids": prompt, "generated": run[:-1], "step": last}
        await ws.send_json_to({**question, "temperature": 0})
        same = await ws.receive_json_from(timeout=30)
        assert same["type"] == "resampled" and same["step"] == last and same["event"]["token_id"] == run[-1]
        await ws.send_json_to({**question, "temperature": 1.0, "top_k": 1, "seed": 5})
        only_best = await ws.receive_json_from(timeout=30)
        assert only_best["event"]["detail"]["kept"] == 1 and only_best["event"]["token_id"] == run[-1]
        await ws.send_json_to({**question, "temperature": 9})
        error = await ws.receive_json_from(timeout=30)
        assert error["type"] == "error" and error["param"] == "temperature"
        await ws.send_json_to({**question, "generated": [99999]})
        error = await ws.receive_json_from(timeout=30)
        assert error["type"] == "error" and "'generated'" in error["message"]

    with_worker(body)
    rows = list(UsageRecord.objects.filter(endpoint="ws.resample").order_by("id").values_list("status", flat=True))
    assert rows == [200, 200, 400, 400]  # one usage row per question, answered or refused


def test_an_unexpected_failure_mid_turn_gets_an_error_frame_and_an_error_row(
    with_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's turn runs the gateway's one lifecycle: a bug anywhere in generation is a server_error frame (without
    its
    internal text), then the usage frame and done; the usage row says 500."""
    from webapp.gateway.client import Generation

    real = Generation.messages

    async def failing(self: Generation) -> Any:
        async for message in real(self):
            yield message
            raise RuntimeError("secret internal detail")

    monkeypatch.setattr(Generation, "messages", failing)

    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_json_to(CHAT)
        frames = await _until(ws, "done")
        error = next(f for f in frames if f["type"] == "error")
        assert error["status"] == 500 and error["code"] == "server_error" and "secret" not in error["message"]
        assert [f["type"] for f in frames][-2:] == ["usage", "done"] and frames[-2]["record"]["status"] == 500

    with_worker(body)
    row = UsageRecord.objects.get(endpoint="ws.chat")
    assert (row.status, row.finish_reason, row.error_code) == (500, "error", "server_error")


@pytest.mark.parametrize(
    "change, param",
    [
        ({"step": "yes"}, "step"),
        ({"step": [1]}, "step"),
        ({"conversation": "seven"}, "conversation"),
        ({"params": {"surprise": 1}}, "params"),
        ({"continue_final_message": 1}, "continue_final_message"),
    ],
)
def test_every_field_of_a_chat_frame_is_typed(with_worker: Any, change: dict[str, Any], param: str) -> None:
    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_json_to({**CHAT, **change})
        frames = await _until(ws, "done")
        error = next(f for f in frames if f["type"] == "error")
        assert error["status"] == 400 and error["param"].startswith(param), error
        assert not any(f["type"] == "trace" for f in frames)

    with_worker(body)


def test_a_logit_bias_beyond_the_vocabulary_is_a_fast_400_and_the_next_turn_runs(with_worker: Any) -> None:
    """Issue 29's first finding on the page's socket: the turn fails at once naming the field (it hung for two minutes
    and left the socket answering "busy" to every later turn)."""

    async def body(ws: WebsocketCommunicator) -> None:
        started = time.monotonic()
        await ws.send_json_to({**CHAT, "params": {**CHAT["params"], "logit_bias": {"99999": 1}}})
        frames = await _until(ws, "done", wait=5)
        error = next(f for f in frames if f["type"] == "error")
        assert error["status"] == 400 and error["param"] == "logit_bias" and time.monotonic() - started < 2
        assert frames[-2]["type"] == "usage" and frames[-2]["record"]["status"] == 400
        await ws.send_json_to(CHAT)
        frames = await _until(ws, "done")
        assert not any(f["type"] == "error" for f in frames) and frames[-2]["record"]["status"] == 200

    with_worker(body)
    assert sorted(UsageRecord.objects.values_list("status", flat=True)) == [200, 400]


def test_next_or_cancel_without_a_turn_gets_an_answer(with_worker: Any) -> None:
    async def body(ws: WebsocketCommunicator) -> None:
        for kind in ("next", "cancel"):
            await ws.send_json_to({"type": kind})
            frame = await ws.receive_json_from(timeout=10)
            assert frame["type"] == "error" and frame["code"] == "no_turn" and kind in frame["message"]

    with_worker(body)


def test_frames_sent_together_are_split_below_the_message_limit() -> None:
    """A paced second of `full` detail is megabytes: it goes as several arrays, each under the limit, in order."""
    sent: list[str] = []
    consumer = PipelineConsumer()

    async def send(text_data: str) -> None:
        sent.append(text_data)

    consumer.send = send  # type: ignore[method-assign]
    frames = [{"type": "trace", "n": i, "pad": "x" * 100_000} for i in range(12)]
    asyncio.run(consumer.send_frames(frames))
    assert len(sent) > 1 and all(len(text) <= MAX_BATCH_BYTES for text in sent)
    messages = [json.loads(text) for text in sent]
    assert all(isinstance(message, list) for message in messages[:-1])
    received = [frame for message in messages for frame in (message if isinstance(message, list) else [message])]
    assert [frame["n"] for frame in received] == list(range(12))


def test_the_page_can_compare_two_models_on_one_text(with_worker: Any) -> None:
    """Both sides through the gateway (one usage row each): the tiny model against itself here, the same tokens and
    the same likeliest next tokens; a bad frame gets the error in the frame's words."""

    async def body(ws: WebsocketCommunicator) -> None:
        await ws.send_json_to({"type": "compare", "models": ["tiny", "tiny"], "text": "the heat"})
        frame = await ws.receive_json_from(timeout=30)
        assert frame["type"] == "comparison" and [s["model"] for s in frame["sides"]] == ["tiny", "tiny"]
        first, second = frame["sides"]
        assert first["ids"] == second["ids"] and first["spans"][-1][1] == len("the heat")
        probs = [x["prob"] for x in first["likely"]]
        assert len(probs) == 10 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
        assert first["likely"] == second["likely"]
        await ws.send_json_to({"type": "compare", "models": ["tiny"], "text": "x"})
        error = await ws.receive_json_from(timeout=30)
        assert error["type"] == "error" and "models" in error["message"]

    with_worker(body)
    statuses = UsageRecord.objects.filter(endpoint="ws.compare").values_list("status", flat=True)
    assert sorted(statuses) == [200, 200, 400]  # each side one row; the refused frame one
