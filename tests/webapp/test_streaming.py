"""The SSE generator on its own, over a gateway Turn with a scripted generation: an error after the stream
started (expected or not), and a client that leaves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from django.test import override_settings
from loops import run_async

from inference.params import SamplingParams
from webapp.api.completions import choices_for, completion
from webapp.api.protocol import ChatCompletionRequest
from webapp.api.responses import chat_stream, complete
from webapp.catalog import ModelRoute
from webapp.gateway.client import ChoiceEvent, Generation
from webapp.gateway.errors import GatewayError
from webapp.gateway.gateway import RequestContext, record_usage
from webapp.gateway.identity import identify_session
from webapp.gateway.lifecycle import Turn
from webapp.usage.models import UsageRecord
from webapp.worker import wire

pytestmark = pytest.mark.django_db(transaction=True)
ROUTE = ModelRoute("tiny", "", ())


class ScriptedGeneration(Generation):
    """A generation whose replies are scripted; `fail` raises where the worker would report an error."""

    def __init__(self, events: list[wire.TraceEvent | Exception]) -> None:
        request = wire.Generate(
            request_id="chatcmpl-test", model="tiny", reply_to="reply.test", messages=[], params=SamplingParams()
        )
        super().__init__(None, request, None)  # type: ignore[arg-type]
        self.script = events
        self.cancelled = False

    async def messages(self) -> AsyncIterator[wire.Waiting | ChoiceEvent]:
        for item in self.script:
            if isinstance(item, Exception):
                raise item
            await asyncio.sleep(0)
            yield ChoiceEvent(0, item)

    async def cancel(self) -> None:
        self.cancelled = True


def _request() -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    )


def _ctx() -> RequestContext:
    ctx = RequestContext("chatcmpl-test", "chat.completions", "127.0.0.1", stream=True)
    ctx.route = ROUTE
    return ctx


def _turn(generation: Generation) -> Turn:
    turn = Turn("chat.completions", "127.0.0.1", stream=True)
    turn.ctx = _ctx()
    turn.generation = generation
    return turn


def _stream_of(generation: Generation) -> AsyncIterator[bytes]:
    return chat_stream(_turn(generation), _request(), choices_for(1, False))


SAMPLED = wire.Sampled(
    t=0.0, step=1, token_id=5, token="Hi", bytes=[72, 105], logprob=-0.1, rank=1, is_stop=False, duration=0.0
)
TEXT = wire.TextDelta(t=0.0, step=1, token_id=5, token="Hi", text="Hi", pending_bytes=[], held_text="")


def test_an_error_after_the_stream_started_is_an_error_event_then_done() -> None:
    generation = ScriptedGeneration(
        [SAMPLED, TEXT, GatewayError(500, "The model failed: boom", "server_error", "server_error")]
    )

    async def collect() -> list[bytes]:
        return [part async for part in _stream_of(generation)]

    parts = run_async(collect())
    assert generation.cancelled  # the worker is told to stop
    assert parts[-1] == b"data: [DONE]\n\n"
    assert parts[0].count(b"data: ") == 2  # the role chunk and the first text, written together
    events = b"".join(parts).split(b"\n\n")[:-1]
    error = json.loads(events[-2].removeprefix(b"data: "))
    assert error == {
        "error": {"message": "The model failed: boom", "type": "server_error", "param": None, "code": "server_error"}
    }
    assert json.loads(events[1].removeprefix(b"data: "))["choices"][0]["delta"] == {"content": "Hi"}
    row = UsageRecord.objects.get(request_id="chatcmpl-test")
    assert (row.status, row.finish_reason, row.completion_tokens) == (500, "error", 1)


def test_an_unexpected_exception_mid_stream_is_a_server_error_event_and_an_error_row() -> None:
    generation = ScriptedGeneration([SAMPLED, TEXT, RuntimeError("internal detail that must not leak")])

    async def collect() -> list[bytes]:
        return [part async for part in _stream_of(generation)]

    parts = run_async(collect())
    assert parts[-1] == b"data: [DONE]\n\n"
    error = json.loads(parts[-2].removeprefix(b"data: "))["error"]
    assert (
        error["code"] == "server_error"
        and "internal detail" not in error["message"]
        and "chatcmpl-test" in error["message"]
    )
    assert generation.cancelled
    row = UsageRecord.objects.get(request_id="chatcmpl-test")
    assert (row.status, row.finish_reason, row.error_code) == (500, "error", "server_error")


def test_a_client_that_leaves_cancels_the_generation_and_is_logged() -> None:
    generation = ScriptedGeneration([SAMPLED, TEXT] * 50)

    async def leave_early() -> None:
        stream = _stream_of(generation)
        await stream.__anext__()
        await stream.__anext__()
        await stream.aclose()  # what Django does when the client disconnects

    run_async(leave_early())
    assert generation.cancelled
    row = UsageRecord.objects.get(request_id="chatcmpl-test")
    assert (row.status, row.finish_reason) == (499, "cancelled")


def test_prompts_are_stored_only_when_the_setting_says_so() -> None:
    ctx = _ctx()
    ctx.prompt_text = "secret question"
    assert record_usage(ctx, 200).prompt_text == ""
    with override_settings(ROUNDTRIP_STORE_PROMPTS=True):
        ctx.request_id = "chatcmpl-kept"
        assert record_usage(ctx, 200).prompt_text == "secret question"


def test_a_request_whose_key_was_deleted_while_it_ran_still_leaves_its_usage_row() -> None:
    from webapp.gateway.identity import identify_key
    from webapp.keys.models import ApiKey

    key, raw = ApiKey.create_key("short-lived")
    ctx = _ctx()
    ctx.identity = identify_key(f"Bearer {raw}")
    key.delete()
    row = record_usage(ctx, 200, "stop", prompt_tokens=5, completion_tokens=2)
    assert (row.api_key_id, row.status, row.prompt_tokens, row.completion_tokens) == (None, 200, 5, 2)


def test_browser_visitors_get_the_configured_session_limits() -> None:
    with override_settings(
        ROUNDTRIP_ANONYMOUS_LIMITS={"requests_per_minute": 3}, ROUNDTRIP_USER_LIMITS={"requests_per_minute": 30}
    ):
        anonymous = identify_session(None, "abc")
        user = identify_session(7, "def")
    assert (anonymous.kind, anonymous.bucket, anonymous.limits.requests_per_minute) == ("anonymous", "session:abc", 3)
    assert (user.kind, user.bucket, user.limits.requests_per_minute) == ("user", "user:7", 30)


def test_an_unexpected_exception_without_streaming_is_a_500_in_openais_shape_and_an_error_row() -> None:
    generation = ScriptedGeneration([SAMPLED, TEXT, KeyError("internal detail")])
    turn = _turn(generation)
    choices = choices_for(1, False)
    response = run_async(complete(turn, choices, lambda created: completion(turn, created, choices)))
    assert response.status_code == 500
    error = json.loads(response.content)["error"]
    assert error["type"] == "server_error" and "internal detail" not in error["message"]
    row = UsageRecord.objects.get(request_id="chatcmpl-test")
    assert (row.status, row.finish_reason, row.completion_tokens) == (500, "error", 1)
