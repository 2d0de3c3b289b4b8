"""API requests that carry a key skip the page's middleware (`webapp.keyed_api`); everything else keeps it."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.db import connection
from loops import run_async

from webapp.keyed_api import KeyedApiHandler, KeyedApiRouter, keyed_api_request


def _scope(path: str, headers: list[tuple[bytes, bytes]], host: bytes = b"127.0.0.1") -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", host), *headers],
        "client": ("127.0.0.1", 5555),
        "server": ("127.0.0.1", 8000),
        "scheme": "http",
        "http_version": "1.1",
        "asgi": {"version": "3.0"},
    }


def test_only_api_requests_with_a_key_take_the_short_way() -> None:
    assert keyed_api_request(_scope("/v1/models", [(b"authorization", b"Bearer rt-x")]))
    assert keyed_api_request(_scope("/v1/messages", [(b"x-api-key", b"rt-x")]))
    assert not keyed_api_request(_scope("/v1/models", [(b"x-csrftoken", b"t")]))  # the page's own calls
    assert not keyed_api_request(_scope("/", [(b"authorization", b"Bearer rt-x")]))


async def _get(scope: dict[str, Any]) -> tuple[int, dict[bytes, bytes], bytes]:
    router = KeyedApiRouter(KeyedApiHandler(), get_asgi_application())  # as webapp.asgi routes (no worker here)
    app = ApplicationCommunicator(router, scope)
    await app.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await app.receive_output(10)
    body = await app.receive_output(10)
    await app.wait(10)
    return start["status"], {name.lower(): value for name, value in start["headers"]}, body["body"]


@pytest.mark.django_db(transaction=True)
def test_a_keyed_request_is_answered_without_the_pages_headers_and_a_bad_host_is_refused() -> None:
    keyed = run_async(_get(_scope("/v1/models", [(b"authorization", b"Bearer rt-unknown")])))
    assert keyed[0] == 401 and b"Incorrect API key" in keyed[2]
    assert b"content-security-policy" not in keyed[1]  # the page's middleware did not run
    page = run_async(_get(_scope("/v1/models", [])))
    assert page[0] == 401 and b"content-security-policy" in page[1]
    refused = run_async(_get(_scope("/v1/models", [(b"authorization", b"Bearer rt-x")], host=b"evil.example")))
    assert refused[0] == 400


def _open_connection() -> int | None:
    return id(connection.connection) if connection.connection is not None else None


@pytest.mark.django_db(transaction=True)
def test_the_api_thread_keeps_its_database_connection_from_one_request_to_the_next() -> None:
    async def two_requests() -> list[int | None]:
        seen = []
        for _ in range(2):
            status, _, _ = await _get(_scope("/v1/models", [(b"authorization", b"Bearer rt-unknown")]))
            assert status == 401  # the key was looked up in the database, on the API's thread
            seen.append(await sync_to_async(_open_connection)())
        return seen

    first, second = run_async(two_requests())
    assert first is not None and first == second


def test_a_keyed_stream_sends_each_part_as_it_comes_and_closes_its_iterator_when_the_client_leaves() -> None:
    from django.http import StreamingHttpResponse

    closed: list[bool] = []

    async def parts() -> Any:
        try:
            yield b"data: 1\n\n"
            yield b"data: 2\n\n"
        finally:
            closed.append(True)

    async def stream(fail_at: int | None) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            if len(sent) == fail_at:
                raise OSError("the client left")
            sent.append(message)

        response = StreamingHttpResponse(parts(), content_type="text/event-stream", headers={"X-Request-Id": "r"})
        with contextlib.suppress(OSError):
            await KeyedApiHandler().send_response(response, send)
        return sent

    sent = run_async(stream(None))
    assert sent[0]["type"] == "http.response.start" and (b"X-Request-Id", b"r") in sent[0]["headers"]
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n", b"data: 2\n\n", None]
    assert [m.get("more_body") for m in sent[1:]] == [True, True, None]  # the last message ends the body
    assert closed == [True]
    cut = run_async(stream(2))  # the second part's send fails: the iterator is closed at once, not left running
    assert len(cut) == 2 and closed == [True, True]
