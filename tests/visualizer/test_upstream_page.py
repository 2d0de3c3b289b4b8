"""The chat page on an upstream model: a gateway whose ROUNDTRIP_MODELS sends "far-away" to another Roundtrip server
(A, on a tiny model) and serves the same tiny model itself as "tiny", so the picker holds both kinds. An upstream turn
draws its forward pass as a closed box naming the server, the upstream's reported log-probabilities as the sampling
stage's candidates and the routing decision in the gateway stage; the next local turn draws the layers again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from page_actions import STUDENT, ask, chromium, exported, open_page, trace_events, wait_done
from servers import Deployment, deployment
from tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.live  # starts servers of its own

CLOSED = '#stage-forward [data-box="upstream"]'
LAYERS = '#stage-forward [data-box="local"]'


@dataclass(frozen=True)
class Servers:
    a: Deployment  # the upstream: a Roundtrip server on the tiny model
    gateway: Deployment

    @property
    def upstream_name(self) -> str:
        return f"far-away@{self.a.url.removeprefix('http://')}"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    model = write_tiny_gguf(tmp_path_factory.mktemp("upstream-page-model") / "tiny.gguf")
    local = {"id": "tiny", "path": str(model), "aliases": []}
    with deployment(tmp_path_factory.mktemp("a"), ROUNDTRIP_MODELS=json.dumps([local])) as a:
        far = {"id": "far-away", "url": f"{a.url}/v1", "upstream_model": "tiny", "api_key_env": "UPSTREAM_KEY_A"}
        models = json.dumps([far, local])
        with deployment(tmp_path_factory.mktemp("gateway"), UPSTREAM_KEY_A=a.key, ROUNDTRIP_MODELS=models) as gateway:
            yield Servers(a, gateway)


@pytest.fixture(scope="module")
def browser(servers: Servers) -> Iterator[Any]:
    yield from chromium()


@pytest.fixture
def page(browser: Any, servers: Servers) -> Iterator[Any]:
    context, page, errors = open_page(browser, servers.gateway.url, STUDENT, viewport={"width": 1440, "height": 1000})
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    yield page
    context.close()
    assert errors == [], f"JavaScript errors, console errors or Content-Security-Policy violations: {errors}"


def replay_on_a_phone(browser: Any, url: str, recording: Path, screenshot: Any) -> None:
    """The recorded turn replayed on a page 390 px wide, its stages' screenshots taken. A page of its own: a page
    resized mid-test was seen to lose an animation frame in headless Chromium, and the page draws only on those."""
    context, page, errors = open_page(browser, url, STUDENT, viewport={"width": 390, "height": 900})
    page.set_input_files("#import-run", str(recording))
    page.wait_for_selector("#replay-run:not([disabled])", state="attached")
    page.locator("#replay-run").dispatch_event("click")  # it sits in the drawer, behind "Chats & settings"
    wait_done(page)
    assert page.is_visible(CLOSED) and page.is_hidden(LAYERS)
    for stage in ("gateway", "forward", "sampling"):
        screenshot(page.locator(f"#stage-{stage}"), f"upstream-{stage}-390")
    screenshot(page, "upstream-page-390")
    context.close()
    assert errors == [], f"JavaScript errors or Content-Security-Policy violations at 390 px: {errors}"


def test_an_upstream_turn_draws_a_closed_box_and_a_local_turn_the_layers_again(
    browser: Any, page: Any, servers: Servers, screenshot: Any, tmp_path: Path
) -> None:
    name = servers.upstream_name
    page.select_option("#model", "far-away")
    page.wait_for_function("document.getElementById('model-card').textContent.includes('served by an upstream server')")
    assert name in page.inner_text("#model-card")
    assert page.is_disabled('input[name="speed"][value="step"]') and page.is_disabled("#tour-start")  # refused (400)
    page.fill("#max_tokens", "6")
    ask(page, "Hello there", model="far-away")
    wait_done(page)

    recorded = exported(page, tmp_path)  # the trace as the page got it: no look inside the model
    assert not trace_events(recorded, "forward") and not trace_events(recorded, "context")
    assert trace_events(recorded, "tokenized")[0]["tokenizer"] == "the upstream's own"
    # stage 5: the closed box, the usual drawing hidden
    assert page.is_visible(CLOSED) and page.is_hidden(LAYERS)
    box = page.inner_text(CLOSED)
    assert f"The forward pass ran on {name} (tiny)" in box
    assert "nothing inside is invented" in box and "out: 6 tokens of text" in box
    # stage 6: the upstream's top log-probabilities as candidates, the chosen one among them
    assert page.locator("#stage-sampling .bar").count() == 10
    assert page.locator("#stage-sampling .bar.chosen").count() == 1
    assert "reported top 10 log-probabilities" in page.inner_text('#stage-sampling [data-field="decision"]')
    # stage 2: the routing decision, and no worker channel
    route = page.inner_text('#stage-gateway [data-field="route"]')
    assert f"answered by {name} (model tiny" in route and "the first server tried" in route
    assert "channel" not in route
    # stages 3 and 4: the upstream's own tokens; its context window out of sight
    assert page.locator("#stage-tokens .chip").count() > 0 and page.is_hidden('#stage-tokens [data-more="bpe"]')
    assert "not visible from here" in page.inner_text("#stage-context")
    # a token's trace: what if and the recomputed detail need the model's logits, which stay upstream
    page.locator(".bubble.assistant .tok").first.dispatch_event("click")
    assert f"sampled on {name}" in page.inner_text("#token-detail")
    assert page.locator("#what-if").count() == 0 and page.locator("#inspect-token").count() == 0
    page.keyboard.press("Escape")

    page.locator("#stage-forward").scroll_into_view_if_needed()
    screenshot(page, "upstream-page")
    for stage in ("gateway", "forward", "sampling"):
        screenshot(page.locator(f"#stage-{stage}"), f"upstream-{stage}")
    replay_on_a_phone(browser, servers.gateway.url, tmp_path / "run.json", screenshot)

    ask(page, "Hello again", model="tiny")
    wait_done(page)
    assert page.is_hidden(CLOSED) and page.is_visible(LAYERS)
    assert page.locator("#stage-forward .layer").count() == 2  # the tiny model's layers, drawn again
    assert "on channel inference.tiny" in page.inner_text('#stage-gateway [data-field="route"]')
    assert "greedy" in page.inner_text('#stage-sampling [data-field="decision"]')
    assert page.is_enabled('input[name="speed"][value="step"]') and page.is_enabled("#tour-start")


def test_a_replayed_upstream_turn_names_the_servers_tried_and_a_missing_tokenizer(
    page: Any, servers: Servers, tmp_path: Path
) -> None:
    """The recording of an upstream turn, edited as if a dead replica had been tried first and the upstream exposed
    no tokenizer, replayed: the gateway stage lists the failure, the tokenization stage says why it draws nothing."""
    page.fill("#max_tokens", "4")
    ask(page, "Hello there", model="far-away")
    wait_done(page)
    recorded = exported(page, tmp_path)
    dead, why = "far-away@127.0.0.1:9", "could not connect (ConnectError)"
    frames = []
    for entry in recorded["frames"]:
        frame = entry["frame"]
        if frame["type"] == "trace" and frame["event"]["event"] == "tokenized":
            continue
        if frame["type"] == "accepted":
            tried = [{"model": "far-away", "upstream": dead, "error": why, "status": None}]
            frame["upstream"] |= {"replicas": [dead, servers.upstream_name], "tried": tried}
        frames.append(entry)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps({**recorded, "frames": frames}))
    page.set_input_files("#import-run", str(path))
    page.click("#replay-run")
    wait_done(page)

    assert "after 1 failed" in page.inner_text('#stage-gateway [data-field="route"]')
    assert page.inner_text('#stage-gateway [data-field="tried"]') == f"tried first: {dead} — {why}"
    assert "exposes no tokenizer" in page.inner_text('#stage-tokens [data-field="count"]')
    assert page.locator("#stage-tokens .chip").count() == 0
    assert "tokens by its usage" in page.inner_text(CLOSED)
    assert page.locator("#stage-loop .loop-strip li").count() > 0  # the prompt's length from the usage


def test_the_bench_page_races_a_local_and_an_upstream_lane(browser: Any, servers: Servers, screenshot: Any) -> None:
    context = browser.new_context(viewport={"width": 1500, "height": 1100}, bypass_csp=True)
    bench = context.new_page()
    errors: list[str] = []
    bench.on("pageerror", lambda error: errors.append(str(error)))
    bench.goto(servers.gateway.url + "/bench/")
    bench.click("#add-lane")
    lanes = bench.locator(".lane")
    for i, model in enumerate(("tiny", "far-away")):
        lanes.nth(i).locator('[name="model"]').select_option(model)
        lanes.nth(i).locator('[name="max_tokens"]').fill("8")
    bench.fill("#runs", "3")
    bench.fill("#prompt", "Tell me about the sea.")
    bench.click("#run")
    bench.wait_for_function("document.getElementById('progress-text').textContent.includes('done')", timeout=60000)
    rows = bench.locator("#summary tbody tr[data-lane]")
    assert rows.count() == 2
    served = [rows.nth(i).locator('[data-col="served-by"]').inner_text() for i in range(2)]
    assert [rows.nth(i).locator('[data-col="ok"]').inner_text() for i in range(2)] == ["3/3", "3/3"]
    assert served == ["this server", servers.upstream_name]  # each lane through this server's gateway, no CORS
    gateway_ms = [rows.nth(i).locator('[data-col="gateway"]').inner_text() for i in range(2)]
    assert all(cell != "—" for cell in gateway_ms) and ";" in gateway_ms[1]  # the upstream lane: per chunk too
    screenshot(bench.locator("main"), "bench-upstream-race")
    context.close()
    assert errors == [], f"JavaScript errors on the benchmark page: {errors}"
