"""The page as a student reads it, on the walkthrough's question at full detail in real Chromium: the attention finder,
the token cursor, the forward pass in two depths with its glossary, the API's own request and SSE bytes, the cost, BPE
merge by merge, and the tour's clock without the reader's pauses."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from conftest import PRICES
from page_actions import ask, exported, settings, show_token, trace_events, wait_done, walk_the_tour

pytestmark = pytest.mark.django_db(transaction=True)
QUESTION = "What's the capital of India?"
MODEL = "smollm2-135m-instruct"


def weight(forward: dict[str, Any], layer: int, head: int, position: int) -> float:
    """The trace's attention weight of the forward's query on `position`, as the page reads it (8-bit rows)."""
    attention = forward["detail"]["attention"]
    _, heads, positions = attention["shape"]
    i = attention["positions"].index(position)
    data = base64.b64decode(attention["data"])
    return data[(layer * heads + head) * positions + i] / 255 * attention["row_max"][layer][head]


def test_the_finder_ranks_the_heads_linking_india_to_capital_and_the_preset_opens_the_strongest(
    page: Any, tmp_path: Path, screenshot: Any
) -> None:
    ask(page, QUESTION, level="full")
    wait_done(page)
    preset = page.locator('#stage-forward [data-field="finder-preset"]')
    assert preset.inner_text() == "The walkthrough's example: “·India” → “·capital”"
    preset.click()
    query = int(page.input_value('#stage-forward [data-field="finder-query"]'))
    key = int(page.input_value('#stage-forward [data-field="finder-key"]'))
    recorded = exported(page, tmp_path)
    prompt = trace_events(recorded, "tokenized")[0]
    answer = [s["token"] for s in trace_events(recorded, "sampled")]
    assert answer[query - len(prompt["ids"])] == " India"  # the answer's "·India", not the question's
    assert key < query and (prompt["tokens"] + answer)[key] == " capital"
    forward = next(f for f in trace_events(recorded, "forward") if f["detail"] and f["kv_length"] - 1 == query)
    layers, heads, _ = forward["detail"]["attention"]["shape"]
    ranked = sorted(
        ((weight(forward, lay, h, key), lay, h) for lay in range(layers) for h in range(heads)), reverse=True
    )
    shown = page.locator('#stage-forward [data-field="finder-list"] button')
    assert shown.count() == 8
    for n in range(8):
        button = shown.nth(n)
        layer, head = (int(button.get_attribute("data-layer")), int(button.get_attribute("data-head")))
        value = float(button.get_attribute("data-weight"))
        assert value == pytest.approx(weight(forward, layer, head, key), abs=1e-6) == pytest.approx(ranked[n][0])
    best_weight, best_layer, best_head = ranked[0]
    assert best_weight > 0.5  # a head that reads "capital" when the answer says "India"
    # the preset opened the strongest: its layer, head and query in the attention view
    assert page.input_value('#stage-forward [data-field="layer-pick"]') == str(best_layer)
    assert page.input_value('#stage-forward [data-field="head-pick"]') == str(best_head)
    assert page.input_value('#stage-forward [data-field="query-pick"]') == str(query)
    assert f"layer {best_layer} of {layers - 1}" in page.inner_text('#stage-forward [data-field="layer-label"]')
    attention = page.locator('#stage-forward details[data-more="attention"]')
    assert "A token attends only to itself and the tokens before it" in attention.inner_text()
    screenshot(attention, "finder-desktop")
    # a head that parks its weight on position 0 is named as an attention sink
    sinks = [(lay, h) for lay in range(layers) for h in range(heads) if weight(forward, lay, h, 0) >= 0.5]
    assert sinks
    page.evaluate(
        """([layer, head]) => { const pick = document.querySelector('#stage-forward [data-field="layer-pick"]');
             pick.value = String(layer); pick.dispatchEvent(new Event("input"));
             const h = document.querySelector('#stage-forward [data-field="head-pick"]');
             h.value = String(head); h.dispatchEvent(new Event("input")); }""",
        list(sinks[0]),
    )
    assert "an attention sink" in page.inner_text('#stage-forward [data-field="sink"]')
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page.locator("#stage-forward .finder"), "finder-390")


def test_after_a_run_the_token_stages_open_on_the_first_token_and_move_together(
    page: Any, tmp_path: Path, screenshot: Any
) -> None:
    ask(page, QUESTION, level="full")
    wait_done(page)
    recorded = exported(page, tmp_path)
    sampled = trace_events(recorded, "sampled")
    first = sampled[0]
    chosen = next(c for c in first["detail"]["candidates"] if c["token_id"] == first["token_id"])
    assert page.inner_text("#stage-sampling .bar.chosen .tok") == "The"
    assert page.inner_text("#stage-sampling .bar.chosen .val").startswith(f"{chosen['raw_prob'] * 100:.1f}%")
    assert f"({math.exp(first['logprob']) * 100:.1f}%)" in page.inner_text("#cursor-text")
    assert "picks token 1" in page.inner_text('#stage-forward [data-field="plain"]')
    assert "prefill" in page.inner_text('#stage-forward [data-field="plain"]')

    def shown() -> tuple[str, str, str, str]:
        return (
            page.inner_text("#stage-sampling .bar.chosen .tok"),
            page.inner_text('#stage-forward [data-field="plain"] .plain-pick'),
            page.inner_text('#stage-detok [data-field="bytes"]'),
            page.get_attribute("#stage-loop li.cursor", "data-step"),
        )

    show_token(page, 5)
    token, plain, detok, row = shown()
    assert token == "·is" and 'token 5: " is"' in plain and "(token 5, " in detok and row == "5"
    page.focus("#cursor-pick")
    page.keyboard.press("ArrowRight")  # the arrow keys move the scrubber, and the stages with it
    page.wait_for_function("document.querySelector('#stage-loop li.cursor')?.dataset.step === '6'")
    token, plain, detok, row = shown()
    assert token == "·New" and 'token 6: " New"' in plain and "(token 6, " in detok and row == "6"
    screenshot(page.locator("#stage-sampling"), "cursor-sampling-token-6")
    # the whole answer as its tokens spell it, beside the chat's rendering of it
    assert page.inner_text('#stage-detok [data-field="raw"]') == "The capital of India is New Delhi."
    assert page.inner_text('#stage-detok [data-field="rendered"] p') == "The capital of India is New Delhi."
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page, "cursor-390")
    # the last token: the logit lens at the last layer agrees with the sampler (greedy: no filter changes it)
    last = sampled[-1]
    forward = next(f for f in trace_events(recorded, "forward") if f["step"] + 1 == last["step"])
    lens = forward["detail"]["logit_lens"][-1]
    top = last["detail"]["candidates"][0]
    assert lens["id"] == top["token_id"] == last["token_id"] and abs(lens["prob"] - top["raw_prob"]) < 0.005


def test_the_forward_pass_reads_plainly_first_with_every_term_defined(
    chat_page: Any, screenshot: Any, browser: Any, site_server: Any
) -> None:
    page = chat_page
    page.click("#pipeline-toggle")
    ask(page, QUESTION, level="full")
    wait_done(page)
    forward = page.locator("#stage-forward")
    plain = page.inner_text('#stage-forward [data-field="plain"]')
    assert "576 numbers" in plain and "30 layers" in plain and "49,152 tokens" in plain and "“The”" in plain
    # every detail is behind "More", closed on a first visit; batching is in the server corner
    more = page.locator("#stage-forward details.more")
    assert more.count() == 4 and all(not m for m in more.evaluate_all("nodes => nodes.map(n => n.open)"))
    assert page.locator('#stage-forward details.server [data-field="batch"]').count() == 1
    assert forward.bounding_box()["height"] < 1300
    screenshot(forward, "forward-plain-desktop")
    terms = page.locator("dfn[data-term]")
    titles = terms.evaluate_all("nodes => nodes.map(n => [n.dataset.term, n.title])")
    assert all(title for _, title in titles), [term for term, title in titles if not title]
    named = {term for term, _ in titles}
    for term in ["residual stream", "‖Δh‖", "SwiGLU", "key/value group", "logit lens", "KV cache", "int4", "SSE"]:
        assert term in named
    page.locator('dfn[data-term="residual stream"]').first.click()
    assert page.inner_text("#glossary-tip").startswith("residual stream: The list of numbers")
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(forward, "forward-plain-390")


def test_the_api_request_and_its_sse_bytes_are_what_the_api_sends(
    page: Any, site_server: Any, make_key: Any, screenshot: Any
) -> None:
    ask(page, QUESTION)
    wait_done(page)
    shown = page.inner_text('#stage-request [data-field="api"]')
    head, _, body = shown.partition("\n\n")
    assert head.startswith("POST /v1/chat/completions")
    request = json.loads(body)
    assert request["stream"] is True and request["stream_options"] == {"include_usage": True}
    assert request["temperature"] == 0 and request["messages"][-1] == {"role": "user", "content": QUESTION}
    page.click('#stage-stream details[data-more="sse"] summary')
    block = page.locator('#stage-stream [data-field="sse"]').text_content()
    screenshot(page.locator("#stage-stream"), "stream-sse")
    screenshot(page.locator("#stage-request"), "request-api")
    # the same request through the real API: the same events, but for their ids and clocks
    headers = {"Authorization": f"Bearer {make_key()}"}
    api = httpx.post(f"{site_server.api}/chat/completions", json=request, headers=headers, timeout=60).text

    def events(text: str) -> list[Any]:
        lines = [line for line in text.split("\n\n") if line]
        assert all(line.startswith("data: ") for line in lines)
        out = []
        for line in lines:
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                out.append(data)
                continue
            chunk = json.loads(data)
            for name in ("id", "created", "system_fingerprint"):
                chunk.pop(name)
            for choice in chunk["choices"]:
                choice.pop("roundtrip_timings", None)
            chunk.pop("roundtrip_timings", None)
            out.append(chunk)
        return out

    assert events(block) == events(api)
    assert events(block)[-2]["usage"]["completion_tokens"] == 9


def test_the_cost_is_the_tokens_at_the_models_prices(page: Any, screenshot: Any) -> None:
    from webapp.usage.models import UsageRecord

    ask(page, QUESTION)
    wait_done(page)
    per_input, per_output = PRICES[MODEL]
    assert page.inner_text('#stage-gateway [data-field="price"]') == (
        f"{MODEL} costs $0.10 per million input tokens and $0.40 per million output tokens"
    )
    cost = (27 * per_input + 9 * per_output) / 1e6
    assert page.inner_text('#stage-gateway [data-field="cost"]') == (
        "cost of this request: 27 input tokens × $0.10/M + 9 output tokens × $0.40/M = $0.0000063"
    )
    row = UsageRecord.objects.filter(endpoint="ws.chat").order_by("-id").first()
    assert row is not None and row.cost_usd == pytest.approx(cost) and f"{cost:.7f}" == "0.0000063"
    screenshot(page.locator("#stage-gateway"), "gateway-cost")
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page.locator("#stage-gateway"), "gateway-cost-390")


def test_bpe_builds_capital_from_its_bytes_into_the_tokenizers_ids(
    page: Any, site_server: Any, make_key: Any, screenshot: Any
) -> None:
    ask(page, QUESTION)
    wait_done(page)
    page.click('#stage-tokens details[data-more="bpe"] summary')
    word = page.locator('#stage-tokens [data-field="bpe-word"]')
    assert word.input_value() == " capital"  # the message's longest token, with its space
    for text in [" capital", "capital"]:
        word.fill(text)
        page.click('#stage-tokens [data-field="bpe-go"]')
        page.wait_for_function(
            f"document.querySelector('#stage-tokens .bpe-end')?.parentElement.textContent.includes('{text.strip()}')"
        )
        ids = httpx.post(
            f"{site_server.api}/tokenize",
            json={"model": "smollm2", "text": text},
            headers={"Authorization": f"Bearer {make_key()}"},
        ).json()["ids"]
        ends = page.locator("#stage-tokens .bpe-end").evaluate_all("nodes => nodes.map(n => n.dataset.ids)")
        assert [int(i) for end in ends for i in end.split(",")] == ids
        steps = page.locator("#stage-tokens .bpe-steps li").all_inner_texts()
        assert steps[0].startswith(f"“{text.replace(' ', '·')}” starts as its {len(text)} bytes")
        assert all(line.startswith("merge ") for line in steps[1:-1]) and len(steps) > 3
    screenshot(page.locator("#stage-tokens"), "bpe-capital")
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page.locator("#stage-tokens"), "bpe-capital-390")


def test_the_tour_keeps_the_chat_in_view_ends_on_the_clock_and_leaves_its_pause_out(
    page: Any, tmp_path: Path, screenshot: Any
) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    settings(page, model=MODEL, level="summary")
    page.click("#tour-start")
    said = walk_the_tour(page, pause_s=5.0)  # five seconds of reading before the rest of the answer
    wait_done(page)
    assert "Time to first token" in said[-1]
    chat = page.locator("#tour [data-tour=chat]")
    assert chat.inner_text() == f"You asked “{QUESTION}” · the answer so far: “The capital of India is New Delhi.”"
    assert chat.is_visible() and 0 <= chat.bounding_box()["y"] < 844
    page.wait_for_timeout(300)
    top = page.evaluate("document.getElementById('stage-latency').getBoundingClientRect().top")
    assert 0 <= top < page.locator("#tour").bounding_box()["y"] - 100  # the tour ended on the latency panel, in view
    screenshot(page, "tour-end-390")
    # the reading pause is named, and in no latency: every gap on the chart is under a second
    assert "before token 2" in page.inner_text('#stage-stream [data-field="pauses"]')
    screenshot(page.locator('#stage-stream [data-field="itl-chart"]'), "itl-chart-pause-390")
    numbers = page.locator('#stage-stream [data-field="itl-chart"] + details.numbers')
    numbers.evaluate("node => { node.open = true; }")
    gaps = [float(cell) for cell in numbers.locator("tbody td").all_inner_texts() if cell != "—"]
    assert len(gaps) >= 14 and max(gaps) < 1000
    itl = page.inner_text('#stage-latency [data-field="itl-client"]')
    assert float(itl.removesuffix(" ms")) < 1000
    page.set_viewport_size({"width": 1500, "height": 1200})  # the export button is in the sidebar
    recorded = exported(page, tmp_path)
    timings = trace_events(recorded, "finished")[0]["timings"]
    assert timings["pauses"][0] >= 4.5 and timings["mean_itl"] < 1  # the server leaves it out too
    page.click("#tour [data-tour=end]")
    assert page.input_value("#level") == "summary" and page.is_checked('input[name="speed"][value="live"]')
