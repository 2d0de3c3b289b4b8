"""Real headless Chromium (Debian's binary) driven by Playwright, screenshots going to artifacts/screenshots/; and a
connected pipeline socket with an in-process worker (`with_worker`) for the socket's own tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.auth import AuthMiddlewareStack
from channels.layers import channel_layers
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings
from inprocess import worker_ready
from load_settings import CPU
from loops import run_async
from page_actions import STUDENT, chromium, open_page

from visualizer.routing import websocket_urlpatterns
from webapp.catalog import ModelRoute
from webapp.worker.service import serve

APP = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))

SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


@pytest.fixture(scope="module")
def browser(site_server: Any) -> Iterator[Any]:
    """Started after the live server (and its database), since Playwright's sync API runs an event loop; one per
    module, so the loop (and what it needs) ends with the browser tests.

    While that loop runs, Django takes the tests' own ORM calls for async ones; they are not, so its check is
    off for exactly that time, and never in a server's environment (`servers.server_env`)."""
    yield from chromium()


@pytest.fixture
def page(browser: Any, site_server: Any) -> Iterator[Any]:
    """The chat page as the pipeline tests use it (`STUDENT`)."""
    context, page, errors = open_page(browser, site_server.url, STUDENT)
    yield page
    context.close()
    assert errors == [], f"JavaScript errors or Content-Security-Policy violations on the page: {errors}"


@pytest.fixture
def chat_page(browser: Any, site_server: Any) -> Iterator[Any]:
    """The chat page as a new visitor first sees it (the pipeline folded, answers rendered, the chat sampling), with
    the clipboard allowed."""
    context, page, errors = open_page(browser, site_server.url, {}, permissions=["clipboard-read", "clipboard-write"])
    yield page
    context.close()
    assert errors == [], f"JavaScript errors or Content-Security-Policy violations on the page: {errors}"


@pytest.fixture
def screenshot() -> Any:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(target: Any, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        target.screenshot(path=str(path))
        return path

    return take


class FrameCommunicator(WebsocketCommunicator):
    """One frame per `receive_json_from`, as the page reads them: a message may hold several (`visualizer.pacing`).
    `messages` counts the messages they came in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pending: list[dict[str, Any]] = []
        self.messages = 0

    async def receive_json_from(self, timeout: float = 1) -> Any:  # noqa: ASYNC109 (the communicator's own signature)
        if not self.pending:
            data = await super().receive_json_from(timeout)
            self.messages += 1
            self.pending = data if isinstance(data, list) else [data]
        return self.pending.pop(0)

    async def receive_nothing(self, timeout: float = 0.1, interval: float = 0.01) -> bool:  # noqa: ASYNC109
        return not self.pending and await super().receive_nothing(timeout, interval)


@pytest.fixture
def with_worker(
    tiny_model_path: Path,
) -> Iterator[Callable[[Callable[[WebsocketCommunicator], Awaitable[None]]], None]]:
    """Run a test body against a connected socket, with an in-process worker serving the tiny model."""
    models = [{"id": "tiny", "path": str(tiny_model_path), "aliases": []}]

    def run(body: Callable[[WebsocketCommunicator], Awaitable[None]]) -> None:
        async def main() -> None:
            channel_layers.backends = {}  # a fresh in-memory layer for this event loop
            worker = asyncio.create_task(serve([ModelRoute("tiny", str(tiny_model_path), ())], show_progress=False))
            await worker_ready("tiny")
            communicator = FrameCommunicator(APP, "/ws/pipeline/")
            connected, _ = await communicator.connect()
            assert connected
            assert (await communicator.receive_json_from())["type"] == "hello"
            try:
                await body(communicator)
            finally:
                await communicator.disconnect()
                worker.cancel()
                await asyncio.gather(worker, return_exceptions=True)

        with override_settings(ROUNDTRIP_MODELS=models, ROUNDTRIP_ANONYMOUS_LIMITS={}, ROUNDTRIP_LOAD=CPU):
            run_async(main())

    yield run
