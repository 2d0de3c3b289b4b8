"""What the browser tests do on the chat page, as a visitor would: ask, read the answer, wait for the turn to end."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SERVICE_SKIP_PREFIX

# Debian's Chromium, headless, as the browser tests and the page benchmark drive it (never `playwright install`).
CHROMIUM = os.environ.get("ROUNDTRIP_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


# What the pipeline tests want of the page: the pipeline open with every "More" part of the forward pass, answers
# shown as their exact tokens, greedy sampling. A visitor's first visit has none of these (`chat_page`).
STUDENT = {
    "pipeline": "open",
    "answer-view": "tokens",
    "greedy": "yes",
    **{f"more.{part}": "open" for part in ("cache", "attention", "halves", "server")},
}


def settings(page: Any, **fields: str) -> None:
    """Set the page's fields by id (the settings sit in a drawer on narrow screens), as a change would."""
    page.evaluate(
        """(fields) => { for (const [id, value] of Object.entries(fields)) {
             const node = document.getElementById(id);
             node.value = value;
             node.dispatchEvent(new Event("change")); } }""",
        fields,
    )


def ask(
    page: Any, text: str, *, level: str = "summary", speed: str = "live", model: str = "smollm2-135m-instruct"
) -> None:
    settings(page, model=model, level=level)
    page.evaluate(
        """(speed) => { const radio = document.querySelector(`input[name="speed"][value="${speed}"]`);
             radio.checked = true; radio.dispatchEvent(new Event("change")); }""",
        speed,
    )
    page.fill("#prompt", text)
    page.click("#send")


def answer(page: Any) -> str:
    """The last answer's text, in the view it is shown in (its exact tokens, or rendered)."""
    bubble = page.locator(".bubble.assistant").last
    tokens = bubble.locator(".tokens-view")
    text: str = (tokens if tokens.count() and tokens.is_visible() else bubble.locator(".answer")).inner_text()
    return text


def wait_done(page: Any) -> None:
    page.wait_for_function("!document.getElementById('send').disabled", timeout=60000)


def show_token(page: Any, step: int) -> None:
    """Move the page's token cursor (the scrubber over the answer) to generated token `step`."""
    page.evaluate(
        """(step) => { const pick = document.getElementById("cursor-pick");
             pick.value = String(step); pick.dispatchEvent(new Event("input")); }""",
        step,
    )
    page.wait_for_function(f"document.querySelector('#stage-loop li.cursor')?.dataset.step === '{step}'")


def exported(page: Any, tmp_path: Path) -> dict[str, Any]:
    """The run the page recorded, through its own export button: the trace as the page received it."""
    page.click("#recording summary")
    with page.expect_download() as download:
        page.click("#export-run")
    path = tmp_path / "run.json"
    download.value.save_as(path)
    recorded: dict[str, Any] = json.loads(path.read_text())
    return recorded


def trace_events(recorded: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [
        f["frame"]["event"]
        for f in recorded["frames"]
        if f["frame"]["type"] == "trace" and f["frame"]["event"]["event"] == kind
    ]


def open_page(browser: Any, url: str, prefs: dict[str, str], **context: Any) -> tuple[Any, Any, list[str]]:
    """A fresh browser context (its own session cookie) on the chat page, connected to the socket, with `prefs` in
    its local storage before the page's scripts run. The tests' own `wait_for_function` predicates are evaluated by
    Playwright inside the page, which the site's Content-Security-Policy (no eval) would refuse, so these contexts
    bypass it; `test_the_page_runs_under_its_content_security_policy` drives the page with the policy enforced."""
    options = {"viewport": {"width": 1500, "height": 1200}, "accept_downloads": True, "bypass_csp": True, **context}
    ctx = browser.new_context(**options)
    if prefs:
        ctx.add_init_script(
            "if (!sessionStorage.getItem('prefs-set')) { sessionStorage.setItem('prefs-set', '1'); "
            + " ".join(f"localStorage.setItem('roundtrip.{k}', {v!r});" for k, v in prefs.items())
            + " }"
        )
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on(
        "console", lambda message: errors.append(message.text) if "Content Security Policy" in message.text else None
    )
    page.goto(url + "/")
    page.wait_for_selector(".status.connected", timeout=15000)
    return ctx, page, errors


TOUR = ["request", "gateway", "tokens", "context", "forward", "sampling", "stream", "detok", "latency"]


def walk_the_tour(page: Any, pause_s: float = 0.4) -> list[str]:
    """Press Next through the eight stages, checking each is the one highlighted, in order; the narrations said.
    At the detokenization step the reader waits `pause_s` (the engine holds after the first token meanwhile)."""
    said = []
    for n, stage in enumerate(TOUR):
        page.wait_for_selector(f"#stage-{stage}.touring", timeout=30000)
        assert page.locator(".stage.touring").count() == 1
        title = page.inner_text("#tour [data-tour=title]")
        assert title.startswith(f"Step {n + 1} of 8") if n < 8 else title.startswith("Last")
        if n < 8:
            page.wait_for_selector("#tour [data-tour=next]:not([disabled])", timeout=30000)
            said.append(page.inner_text("#tour [data-tour=text]"))
            if stage == "detok":
                page.wait_for_timeout(pause_s * 1000)
                assert page.locator(".bubble.assistant:last-child .tok").count() == 1
            page.click("#tour [data-tour=next]")
    page.locator("#tour [data-tour=text]", has_text="Time to first token").wait_for(timeout=120000)
    said.append(page.inner_text("#tour [data-tour=text]"))
    return said


def chromium() -> Iterator[Any]:
    """Debian's Chromium under Playwright, for a module-scoped `browser` fixture started after its live server."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{SERVICE_SKIP_PREFIX} Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"
    try:
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            yield launched
            launched.close()
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
