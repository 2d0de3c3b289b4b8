"""The chat page and its live pipeline in real headless Chromium, against a real server and model."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import torch
from page_actions import answer, ask, exported, settings, show_token, trace_events, wait_done, walk_the_tour
from servers import server_env, start, stop, wait_ready

from inference.batch import Chunk

pytestmark = pytest.mark.django_db(transaction=True)
STAGES = ["request", "gateway", "tokens", "context", "forward", "sampling", "stream", "detok", "latency"]


def test_the_seed_question_streams_and_fills_every_stage_with_real_values(
    page: Any, site_server: Any, make_key: Any, screenshot: Any
) -> None:
    ask(page, "What's the capital of India?", level="full")
    page.wait_for_function(
        "document.querySelector('.bubble.assistant .text').textContent.includes('New Delhi')", timeout=60000
    )
    wait_done(page)
    assert answer(page) == "The capital of India is New Delhi."

    # 1. the request JSON as it left
    sent = json.loads(page.inner_text('#stage-request [data-field="json"]'))
    assert (
        sent["messages"][-1] == {"role": "user", "content": "What's the capital of India?"} and sent["level"] == "full"
    )
    # 2. gateway checks, rate gauge, route and usage-log entry
    assert [li.split(" — ")[0] for li in page.locator('#stage-gateway [data-field="checks"] li').all_inner_texts()] == [
        "authenticate",
        "rate_limit",
        "route",
        "usage_log",
    ]
    assert "smollm2-135m-instruct" in page.inner_text('#stage-gateway [data-field="route"]')
    assert "200 stop, 27 + 9 tokens" in page.inner_text('#stage-gateway [data-field="usage"]')
    # 3. token chips carry the ids /v1/tokenize gives
    chip_ids = [
        int(i) for i in page.locator("#stage-tokens .chip").evaluate_all("nodes => nodes.map(n => n.dataset.id)")
    ]
    r = httpx.post(
        f"{site_server.api}/tokenize",
        json={"model": "smollm2", "text": "What's the capital of India?"},
        headers={"Authorization": f"Bearer {make_key()}"},
    )
    assert chip_ids == r.json()["ids"] == [1780, 506, 260, 3575, 282, 3089, 47]
    # 4. context segments and fill
    assert page.locator("#stage-context .segment.message").inner_text() == "7"
    assert "your message 7" in page.inner_text('#stage-context [data-field="legend"]')
    assert "27 prompt tokens" in page.inner_text('#stage-context [data-field="fill-text"]')
    # 5. forward pass with the full-level pictures
    assert page.locator("#stage-forward .layer").count() == 30
    # live: six evenly spaced layers; on demand: all 30
    assert page.locator('#stage-forward [data-field="lens"] tbody tr').count() == 6
    assert "9 heads" in page.inner_text('#stage-forward [data-field="layer-label"]')
    assert "decoded together with" in page.inner_text('#stage-forward [data-field="batch"]')
    assert page.inner_text('#stage-forward [data-field="weights"]').startswith("weights: fp32")  # the tests pin fp32
    assert page.locator('#stage-forward [data-field="steps"] canvas').count() >= 1  # the step timeline
    assert page.inner_text('#stage-context [data-field="cache"]').startswith("prefix cache:")
    # 6. sampling: the chosen tokens, token by token, spell the answer (the stages open on the first token)
    assert page.inner_text("#stage-sampling .bar.chosen .tok") == "The"
    tokens = page.locator(".bubble.assistant .tok").all_inner_texts()
    assert "".join(tokens) == "The capital of India is New Delhi." and len(tokens) == 8
    # 7. streaming frames and 8. detokenization
    assert page.locator('#stage-stream [data-field="frames"] li').count() == 8
    assert page.inner_text('#stage-detok [data-field="appended"]') == '"The"'
    # latency: browser and server side by side
    for cell in ["ttft-client", "ttft-server", "itl-client", "itl-server"]:
        assert page.inner_text(f'#stage-latency [data-field="{cell}"]').endswith("ms")
    for stage in STAGES:
        screenshot(page.locator(f"#stage-{stage}"), f"stage-{stage}")
    screenshot(page, "chat-page")


def test_clicking_a_token_opens_its_trace_and_more_on_demand(page: Any, screenshot: Any) -> None:
    ask(page, "What's the capital of India?")  # summary level: no attention in the live frames
    wait_done(page)
    page.locator(".bubble.assistant .tok").nth(5).click()
    detail = page.inner_text("#token-detail")
    assert "Token 6" in detail and "New" in detail and "logprob" in detail
    page.click("#inspect-token")
    page.wait_for_selector("#inspection canvas", timeout=30000)
    assert "9 heads over 32 of 32 positions" in page.inner_text("#inspection")  # 27 prompt tokens + 5 generated
    assert page.locator("#inspection .lens tbody tr").count() == 30
    # both halves of every layer and the picked layer's neurons, recomputed
    assert page.locator("#inspection .neurons li").count() == 8 and "layer 29:" in page.inner_text("#inspection")
    page.click("#inspection .chart + details.numbers summary")
    # the chart fills it when drawn
    page.locator("#inspection .chart + details.numbers tbody tr").nth(29).wait_for(timeout=10000)
    assert page.locator("#inspection .chart + details.numbers tbody tr").count() == 30
    screenshot(page.locator("#token-dialog"), "token-detail")


def test_what_if_draws_a_step_again_with_other_settings_on_its_real_logits(
    page: Any, tmp_path: Path, smollm2: Any, screenshot: Any
) -> None:
    ask(page, "What's the capital of India?")
    wait_done(page)
    recorded = exported(page, tmp_path)
    prompt = trace_events(recorded, "tokenized")[0]["ids"]
    before = [e["token_id"] for e in trace_events(recorded, "sampled")][:5]
    page.locator(".bubble.assistant .tok").nth(5).click()  # token 6: " New" 32.9 %, " Mumbai" 29.4 %
    result = page.locator('#what-if [data-field="what-if-result"]')

    def draw(**settings: float) -> str:
        for name, value in settings.items():
            page.fill(f'#what-if input[name="{name}"]', str(value))
        page.click('#what-if button[type="submit"]')
        page.wait_for_function("!document.querySelector('#what-if button[type=submit]').disabled", timeout=30000)
        return str(result.inner_text())

    greedy = draw(temperature=0)
    assert "Drawn: ·New" in greedy and "The same token as the answer got." in greedy
    assert "·Mumbai" in page.inner_text("#what-if table")  # the runner-up, with its probability under these settings
    assert "1 token left" in draw(temperature=0.7, min_p=0.95)  # only the likeliest survives min-p
    # the distribution shown is softmax(logits / 0.7) of that step's logits, computed here directly from the model
    ids = prompt + before
    plan = smollm2.model.plan([Chunk(0, 0, len(ids))])
    logits = smollm2.model(torch.tensor(ids), plan, smollm2.model.new_cache(1, len(ids)))[0].float()
    expected = torch.softmax(logits / 0.7, dim=-1)
    for row in page.locator("#what-if table tr").all()[1:4]:
        token, _, adjusted, _ = row.locator("td").all_inner_texts()
        token_id = smollm2.tokenizer.encode(token.replace("·", " ")).ids[0]
        assert abs(float(adjusted.rstrip("%")) - float(expected[token_id]) * 100) < 0.05, token
    other = next(
        (
            o
            for o in (draw(temperature=2, top_k=2, min_p=0, seed=seed) for seed in range(1, 6))
            if "Drawn: ·Mumbai" in o
        ),
        "",
    )
    # two near-equal candidates left: some seed picks the other (the page's rate limit allows 10 asks a minute)
    assert "A different token" in other
    screenshot(page.locator("#token-dialog"), "what-if")
    # the branch: the answer up to that token, then the model goes on from " Mumbai"
    page.click('#what-if [data-field="branch"]')
    wait_done(page)
    branch = page.locator(".bubble.assistant").last
    assert branch.locator(".branch-prefix").inner_text() == "The capital of India is Mumbai"
    assert branch.locator(".tok").count() > 0  # the continuation, token by token
    # the same question, answered again: the branch is the answer's second version, the first one step away
    assert page.locator(".bubble.user").count() == 1 and branch.locator(".version-n").inner_text() == "2 / 2"
    screenshot(page.locator("#bubbles"), "branch")


def test_step_mode_advances_one_token_per_click(page: Any, screenshot: Any) -> None:
    ask(page, "What's the capital of India?", speed="step")
    page.wait_for_function("document.querySelectorAll('.bubble.assistant .tok').length === 1", timeout=30000)
    page.wait_for_timeout(500)
    assert page.locator(".bubble.assistant .tok").count() == 1
    for expected in (2, 3, 4):
        page.click("#next")
        page.wait_for_function(
            f"document.querySelectorAll('.bubble.assistant .tok').length === {expected}", timeout=30000
        )
        page.wait_for_timeout(300)
        assert page.locator(".bubble.assistant .tok").count() == expected
    assert answer(page) == "The capital of India"
    # the same Next on top of the stages: the sampling stage, on screen, moves to the new token
    page.locator("#stage-sampling").scroll_into_view_if_needed()
    page.click("#cursor-next")
    page.wait_for_function("document.querySelectorAll('.bubble.assistant .tok').length === 5", timeout=30000)
    page.wait_for_function("document.querySelector('#stage-sampling .bar.chosen .tok')?.textContent === '·is'")
    screenshot(page, "step-mode")
    page.click("#cancel")
    wait_done(page)


def test_an_exported_run_replays_without_the_model(page: Any, tmp_path: Path, screenshot: Any) -> None:
    ask(page, "What's the capital of India?")
    wait_done(page)
    page.click("#recording summary")
    with page.expect_download() as download:
        page.click("#export-run")
    path = tmp_path / "run.json"
    download.value.save_as(path)
    recorded = json.loads(path.read_text())
    assert recorded["format"] == "roundtrip-run" and any(f["frame"]["type"] == "done" for f in recorded["frames"])
    page.click("#new-conversation")
    page.set_input_files("#import-run", str(path))
    page.click("#replay-run")
    page.wait_for_function(
        "document.querySelector('.bubble.assistant:last-child .text').textContent === 'The capital of India is New "
        "Delhi.'",
        timeout=30000,
    )
    assert page.inner_text(".bubble.user .text").startswith("(replay)")
    assert page.locator("#stage-tokens .chip").count() == 7
    screenshot(page, "replay")


def test_markup_in_a_message_shows_literally(page: Any) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    ask(page, "<img src=x onerror=alert(1)>", model="tiny")
    wait_done(page)
    assert page.inner_text(".bubble.user .text") == "<img src=x onerror=alert(1)>"
    assert page.locator(".bubbles img, .pipeline img").count() == 0 and dialogs == []
    shown = "".join(page.locator("#stage-tokens .chip .tok-text").all_inner_texts())
    assert "<img·src=x·onerror=alert(1)>".replace("·", "") in shown.replace("·", "")


def test_attention_is_labelled_by_token_and_the_head_view_draws_lines(
    page: Any, tmp_path: Path, screenshot: Any
) -> None:
    ask(page, "What's the capital of India?", level="full")
    wait_done(page)
    show_token(page, 9)  # the last: its forward pass read all 35 positions
    forward = "#stage-forward"
    page.locator(f'{forward} [data-field="layer-pick"]').fill("29")
    heads = f'{forward} [data-field="heads"]'
    columns = page.locator(f"{heads} .hm-col").all_inner_texts()
    assert len(columns) == 35 and columns[17] == "·capital" and columns[19] == "·India" and columns[34] == "."
    assert page.locator(f"{heads} .hm-row").all_inner_texts() == [f"head {h}" for h in range(9)]
    assert "seg-message" in page.locator(f"{heads} .hm-col").nth(19).get_attribute("class")
    assert "seg-system" in page.locator(f"{heads} .hm-col").nth(4).get_attribute("class")
    assert "seg-answer" in page.locator(f"{heads} .hm-col").nth(30).get_attribute("class")

    # hovering a cell names its token, position and the weight the trace carries
    recorded = exported(page, tmp_path)
    last = [f for f in trace_events(recorded, "forward") if f["detail"]][-1]["detail"]["attention"]
    _, n_heads, positions = last["shape"]
    raw = base64.b64decode(last["data"])
    weight = raw[(29 * n_heads + 2) * positions + 19] / 255 * last["row_max"][29][2]
    canvas = page.locator(f"{heads} canvas")
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    page.mouse.move(box["x"] + (19.5 / positions) * box["width"], box["y"] + (2.5 / n_heads) * box["height"])
    tip = page.inner_text(f"{heads} .hm-tip")
    assert "head 2" in tip and "“·India” (position 19, your message, id 3089)" in tip and f"weight {weight:.4f}" in tip
    # the same numbers as a table: a row per key token, a column per head
    page.click(f"{heads} details.numbers summary")
    # rendered when the toggle event comes
    page.locator(f"{heads} details.numbers tbody tr").nth(19).wait_for(timeout=10000)
    row = page.locator(f"{heads} details.numbers tbody tr").nth(19).locator("td").all_inner_texts()
    assert len(row) == 9 and abs(float(row[2]) - weight) < 5e-5

    # the head view: one line per key for the chosen head, a line per key and head for its key/value group
    page.select_option(f'{forward} [data-field="head-pick"]', "4")
    lines = page.locator(f'{forward} [data-field="head-view"] line')
    assert lines.count() == 35 and set(lines.evaluate_all("ls => ls.map(l => l.dataset.head)")) == {"4"}
    page.check(f'{forward} [data-field="group-pick"]')
    assert lines.count() == 3 * 35 and set(lines.evaluate_all("ls => ls.map(l => l.dataset.head)")) == {"3", "4", "5"}
    screenshot(page.locator(forward), "attention-labelled")

    # the token × token matrix of the chosen head: a row per token fed (the prompt's last, then the answer's)
    rows = page.locator(f'{forward} [data-field="matrix"] .hm-row').all_inner_texts()
    assert rows == ["↵", "The", "·capital", "·of", "·India", "·is", "·New", "·Delhi", "."]
    # another query, picked on the head view's left side: the views follow it
    page.locator(f'{forward} [data-field="head-view"] .hv-queries [data-pick="30"]').click()
    assert "query “·India” at position 30" in page.inner_text(f'{forward} [data-field="layer-label"]')
    assert page.locator(f"{heads} .hm-col").count() == 31


def test_every_prompt_row_of_a_layer_is_recomputed_on_demand(page: Any, screenshot: Any) -> None:
    ask(page, "What's the capital of India?", level="full")
    wait_done(page)
    forward = "#stage-forward"
    matrix = f'{forward} [data-field="matrix"]'
    assert page.locator(f"{matrix} .hm-row").count() == 9  # live: the prompt's last token, then the 8 tokens fed back
    page.locator(f'{forward} [data-field="layer-pick"]').fill("3")
    assert page.inner_text(f'{forward} [data-field="matrix-full"]').startswith("Every prompt row")
    page.click(f'{forward} [data-field="matrix-full"]')
    page.wait_for_function(
        f"document.querySelector('{forward} [data-field=\"matrix-status\"]')"
        ".textContent.startsWith('every prompt row')",
        timeout=30000,
    )
    rows = page.locator(f"{matrix} .hm-row").all_inner_texts()
    assert len(rows) == 27 + 8 and rows[0] == "<|im_start|>" and rows[19] == "·India" and rows[27] == "The"
    numbers = page.locator(f"{matrix} details.numbers")  # a table row per key token, a column per query row
    numbers.locator("summary").click()
    numbers.locator("tbody tr").nth(1).wait_for(timeout=10000)  # rendered when the toggle event comes
    on_first = numbers.locator("tbody tr").nth(0).locator("td").all_inner_texts()
    on_second = numbers.locator("tbody tr").nth(1).locator("td").all_inner_texts()
    assert on_first[0] == "1"  # position 0 sees only itself: all of its attention
    # causal: position 1 is after the first query, not after the second
    assert on_second[0] == "—" and on_second[1] != "—"
    screenshot(page.locator(forward), "prompt-matrix")


def test_the_page_draws_any_models_shape_from_the_trace(page: Any) -> None:
    """No module knows SmolLM2's 30 layers, 9 heads or 3 key/value heads: the tiny model (2 layers, 4 heads, 2 key/value
    heads) is drawn with its own."""
    ask(page, "the heat is on", level="full", model="tiny")
    wait_done(page)
    forward = "#stage-forward"
    assert page.locator(f"{forward} .layer").count() == 2 and page.locator(f"{forward} .layer .half.ffn").count() == 2
    assert page.locator(f'{forward} [data-field="heads"] .hm-row').all_inner_texts() == [f"head {h}" for h in range(4)]
    assert page.locator(f'{forward} [data-field="head-pick"] option').count() == 4
    assert page.locator(f'{forward} [data-field="layer-pick"]').get_attribute("max") == "1"
    page.select_option(f'{forward} [data-field="head-pick"]', "3")
    page.check(f'{forward} [data-field="group-pick"]')
    heads = page.locator(f'{forward} [data-field="head-view"] line').evaluate_all("ls => ls.map(l => l.dataset.head)")
    assert set(heads) == {"2", "3"}  # 4 query heads over 2 key/value heads: pairs
    assert page.locator(f'{forward} [data-field="overview"] .hm-col').count() == 2


def test_the_forward_pass_shows_both_halves_of_every_layer(page: Any, tmp_path: Path, screenshot: Any) -> None:
    ask(page, "What's the capital of India?", level="full")
    wait_done(page)
    show_token(page, 9)
    forward = "#stage-forward"
    recorded = exported(page, tmp_path)
    detail = [f for f in trace_events(recorded, "forward") if f["detail"]][-1]["detail"]
    # the layer stack: every layer in two halves
    assert (
        page.locator(f"{forward} .layer").count() == 30 and page.locator(f"{forward} .layer .half.attn").count() == 30
    )
    assert page.locator(f"{forward} .layer .half.ffn").count() == 30
    # the chart: one bar pair per layer, its numbers those of the trace
    halves = page.locator(f'{forward} [data-field="halves"] + details.numbers')
    halves.locator("summary").click()
    halves.locator("tbody tr").nth(29).wait_for(timeout=10000)  # drawn on the next animation frame
    assert halves.locator("thead th").all_inner_texts() == ["layer", "attention ‖Δh‖", "feed-forward ‖Δh‖"]
    rows = halves.locator("tbody tr")
    assert rows.count() == 30
    for layer in (0, 17, 29):
        cells = rows.nth(layer).locator("td").all_inner_texts()
        assert abs(float(cells[0]) - detail["attention_update_norms"][layer]) < 0.01
        assert abs(float(cells[1]) - detail["feed_forward_update_norms"][layer]) < 0.01
    # the chosen layer's top SwiGLU neurons, as the trace ranks them
    page.locator(f'{forward} [data-field="layer-pick"]').fill("29")
    neurons = page.locator(f'{forward} [data-field="neurons"] li')
    assert neurons.count() == 8
    assert neurons.locator(".neuron-id").all_inner_texts() == [f"#{n['index']}" for n in detail["top_neurons"][29]]
    assert "|silu(gate) × up|" in page.inner_text(forward)
    assert "layer 29:" in page.inner_text(f'{forward} [data-field="halves-text"]')
    # the logit lens after each half; the last layer's guess after its feed-forward half is the answer's last step
    lens = page.locator(f'{forward} [data-field="lens"] tbody tr')
    assert lens.count() == 6 and lens.last.get_attribute("class") == "picked"
    last = lens.last.locator("td").all_inner_texts()
    assert (
        last[0] == f"{detail['logit_lens_after_attention'][-1]['token'].replace(' ', '·')} "
        f"{detail['logit_lens_after_attention'][-1]['prob'] * 100:.1f}%"
    )
    assert last[1].startswith("<|im_end|>")
    screenshot(page.locator(forward), "forward-both-halves")

    # rotary positions with the model's own base and rotary dims, for the query token the views show
    context = trace_events(recorded, "context")[0]
    assert (context["rope_base"], context["rope_dim"]) == (100000.0, 64)  # SmolLM2's config
    page.locator(f'{forward} [data-field="head-view"] .hv-queries [data-pick="30"]').click()
    rope = f'{forward} [data-field="rope"]'
    # 31 positions, halves swapped
    assert "for “·India” at position 30, and at position 14" in page.inner_text(f"{rope} caption")
    rows = page.locator(f"{rope} tbody tr")
    assert rows.locator("th").all_inner_texts() == ["0", "1", "2", "4", "8", "16", "31"]
    theta = 100000.0 ** (-2 * 4 / 64)
    cells = rows.nth(3).locator("td").all_inner_texts()
    assert (
        cells[0] == f"{theta:.4g}"
        and cells[1] == f"{30 * theta:.3f} ({math.degrees((30 * theta) % (2 * math.pi)):.1f}°)"
    )
    assert cells[2] == f"{14 * theta:.3f} ({math.degrees((14 * theta) % (2 * math.pi)):.1f}°)"
    assert "Shuffle the words" in page.inner_text(rope) and "base 100000 and d = 64" in page.inner_text(rope)
    screenshot(page.locator(rope), "forward-rope")

    # a recording made before the halves and RoPE numbers were traced still replays (the page's fixture fails on any
    # script error)
    for f in recorded["frames"]:
        event = f["frame"].get("event") or {}
        for key in ("attention_update_norms", "feed_forward_update_norms", "logit_lens_after_attention", "top_neurons"):
            (event.get("detail") or {}).pop(key, None)
        for key in ("rope_base", "rope_dim"):
            event.pop(key, None)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(recorded))
    page.set_input_files("#import-run", str(old))
    page.click("#replay-run")
    page.wait_for_function(
        "document.querySelector('.bubble.assistant:last-child .text').textContent === 'The capital of India is New "
        "Delhi.'",
        timeout=30000,
    )
    lens_rows = f'{forward} [data-field="lens"] tbody tr'
    page.wait_for_function("rows => document.querySelectorAll(rows).length === 6", arg=lens_rows, timeout=15000)
    assert page.locator(lens_rows).count() == 6 and page.inner_text(rope) == ""


def ms_text(value: float) -> str:
    """A duration as the page's `ms()` writes it."""
    return f"{value:.2f} ms" if value < 10 else f"{value:.0f} ms"


def test_the_guided_tour_walks_the_eight_stages_live_and_over_a_replay(
    page: Any, tmp_path: Path, screenshot: Any
) -> None:
    from webapp.usage.models import UsageRecord

    page.select_option("#model", "smollm2-135m-instruct")
    page.uncheck("#greedy")
    settings(page, level="summary")
    page.click("#tour-start")  # the walkthrough's question by default: greedy, full detail, step mode
    said = walk_the_tour(page)
    wait_done(page)
    assert answer(page) == "The capital of India is New Delhi."
    assert "[1780, 506, 260, 3575, 282, 3089, 47]" in said[2] and "27 tokens" in said[3] and "“The”" in said[5]
    assert "the system prompt" in said[0] and "earlier message" not in said[0]  # a fresh chat: no earlier turns
    # one count everywhere, said once: 9 tokens with the end-of-sequence token, 8 of them with text
    assert "9 tokens counting the end-of-sequence token (8 with text)" in said[-1]
    assert page.inner_text('#stage-stream [data-field="rate"]').startswith("8 tokens with text (the end-of-sequence")
    assert "9 tokens" in page.locator(".bubble.assistant .stats").last.inner_text()
    screenshot(page, "tour-live-end")
    page.click("#tour [data-tour=end]")
    assert page.is_hidden("#tour") and page.locator(".stage.touring").count() == 0
    # the visitor's own settings are back: the next question is not held after its first token
    assert page.input_value("#level") == "summary" and not page.is_checked("#greedy")
    assert page.is_checked('input[name="speed"][value="live"]') and page.is_hidden("#next")
    # the latency panel ended it: TTFT and ITL with this run's own numbers
    recorded = exported(page, tmp_path)
    timings = trace_events(recorded, "finished")[0]["timings"]
    gateway = next(f["frame"] for f in recorded["frames"] if f["frame"]["type"] == "gateway")
    parts = [
        ("gateway", sum(s["ms"] for s in gateway["stages"])),
        ("queue", timings["queue"] * 1000),
        ("tokenize", timings["tokenize"] * 1000),
        ("prefill", timings["prefill"] * 1000),
    ]
    assert "Time to first token (TTFT) = " + " + ".join(f"{name} {ms_text(v)}" for name, v in parts) in said[-1]
    decode = sorted(f["duration"] * 1000 for f in trace_events(recorded, "forward") if f["phase"] == "decode")
    assert f"one decode step {ms_text((decode[3] + decode[4]) / 2)} + sampling" in said[-1] and "network" in said[-1]

    # the same tour over the recording, without the model: no new request reaches the server
    requests = UsageRecord.objects.count()
    page.click("#replay-tour")
    said = walk_the_tour(page)
    page.wait_for_function(
        "document.querySelector('.bubble.assistant:last-child .text').textContent === 'The capital of India is New "
        "Delhi.'",
        timeout=30000,
    )
    assert "[1780, 506, 260, 3575, 282, 3089, 47]" in said[2] and "Time to first token" in said[-1]
    assert UsageRecord.objects.count() == requests
    screenshot(page, "tour-replay")


def test_the_loop_strip_grows_a_row_per_token_and_the_context_shows_positions(
    page: Any, tmp_path: Path, screenshot: Any
) -> None:
    ask(page, "What's the capital of India?")
    wait_done(page)
    rows = page.locator("#stage-loop .loop-strip li")
    assert rows.count() == 9  # 8 tokens of text, then the end-of-sequence token
    sampled = trace_events(exported(page, tmp_path), "sampled")
    assert rows.locator(".loop-n").all_inner_texts() == [f"step {n}" for n in range(1, 10)]
    assert rows.nth(4).locator(".loop-prompt").inner_text() == "[27 prompt tokens] + "
    assert rows.nth(4).locator(".loop-answer").inner_text() == "The·capital·of·India"
    assert rows.nth(8).locator(".loop-answer").inner_text() == "The·capital·of·India·is·New·Delhi."
    assert rows.nth(4).locator(".loop-out").inner_text() == "·is"
    assert [rows.nth(n).locator(".loop-kv-n").inner_text() for n in range(9)] == [f"KV {27 + n}" for n in range(9)]
    last = rows.nth(8)
    assert (
        "eos" in last.get_attribute("class")
        and last.locator(".loop-out").inner_text() == "<|im_end|> (end of sequence)"
    )
    assert (
        sampled[-1]["is_stop"]
        and last.locator(".loop-p").inner_text() == f"{math.exp(sampled[-1]['logprob']) * 100:.1f}%"
    )
    screenshot(page.locator("#stage-loop"), "loop-strip")

    # the context stage: every prompt token with its position, as text
    chips = page.locator('#stage-context [data-field="positions"] .chip')
    assert chips.count() == 27
    assert chips.nth(19).inner_text().split() == ["19", "·India", "3089"] and "seg-message" in chips.nth(
        19
    ).get_attribute("class")
    assert chips.nth(26).locator(".tok-pos").inner_text() == "26"
    screenshot(page.locator("#stage-context"), "context-positions")


def test_every_number_is_text_and_the_keyboard_reaches_tokens_and_stages(page: Any, site_server: Any) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=site_server.url)
    ask(page, "What's the capital of India?")
    wait_done(page)
    # token ids are text: selectable, copyable, read aloud
    chips = page.inner_text('#stage-tokens [data-field="chips"]')
    assert all(str(i) in chips for i in [1780, 506, 260, 3575, 282, 3089, 47])
    page.click("#stage-tokens .copy-ids-button")
    assert page.input_value("#stage-tokens .copy-ids-text") == "[1780, 506, 260, 3575, 282, 3089, 47]"
    page.locator("#stage-tokens .copy-ids-button", has_text="ids copied").wait_for(timeout=5000)
    assert page.evaluate("navigator.clipboard.readText()") == "[1780, 506, 260, 3575, 282, 3089, 47]"
    # a chart's numbers behind its toggle
    itl = page.locator("#stage-stream details.numbers")
    itl.locator("summary").click()
    itl.locator("thead th").nth(2).wait_for(timeout=10000)  # the chart fills it when drawn
    assert itl.locator("thead th").all_inner_texts() == ["token", "browser", "server"]
    legend = page.inner_text("#stage-stream .u-legend")
    assert "browser" in legend and "server" in legend and "--" not in legend  # readable without a hover
    assert (
        itl.locator("tbody tr").count() >= 7 and itl.locator("tbody td").first.inner_text().replace(".", "").isdigit()
    )
    # arrow keys: between token chips, between stages, along the answer (Enter opens a token)
    page.locator("#stage-tokens .chip").first.focus()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.querySelector('.tok-id').textContent") == "260"
    page.keyboard.press("End")
    assert page.evaluate("document.activeElement.dataset.id") == "47"
    page.locator("#stage-request").focus()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    assert page.evaluate("document.activeElement.id") == "stage-tokens"
    page.locator(".bubble.assistant .tok").first.focus()
    for _ in range(5):
        page.keyboard.press("ArrowRight")
    page.keyboard.press("Enter")
    assert "Token 6" in page.inner_text("#token-detail")


def test_a_turn_is_kept_in_the_conversation_list_and_its_history_goes_back_in(page: Any) -> None:
    page.fill("#max_tokens", "8")  # the tiny model's context is 256 tokens
    ask(page, "the heat is on", model="tiny")
    wait_done(page)
    page.wait_for_selector(".conversation-list button")
    ask(page, "and again", model="tiny")
    wait_done(page)
    sent = json.loads(page.inner_text('#stage-request [data-field="json"]'))
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "user"]
    page.click("#new-conversation")
    assert page.locator(".bubble").count() == 0
    page.locator(".conversation-list button").first.click()
    page.wait_for_function("document.querySelectorAll('.bubble').length === 4", timeout=10000)
    assert page.locator(".bubble.user .text").all_inner_texts() == ["the heat is on", "and again"]


def test_it_works_at_phone_width(page: Any, screenshot: Any) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    ask(page, "What's the capital of India?", level="full")  # full: the attention views must fit too
    wait_done(page)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    screenshot(page.locator("#stage-forward"), "phone-forward")
    screenshot(page, "phone")
    # the guided tour (over the recording) fits too: its panel inside the window, the stage it talks about beside it
    page.click("#sidebar-toggle")  # the settings and the recordings are behind a button on a phone
    page.click("#recording summary")
    page.click("#replay-tour")
    page.wait_for_selector("#tour [data-tour=next]:not([disabled])", timeout=10000)
    page.click("#tour [data-tour=next]")
    page.wait_for_selector("#stage-gateway.touring", timeout=10000)
    box = page.locator("#tour").bounding_box()
    assert (
        box["x"] >= 0
        and box["x"] + box["width"] <= 390
        and page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    )
    screenshot(page, "phone-tour")


def test_the_page_reconnects_after_the_server_drops_the_socket(
    browser: Any, tiny_model_path: Path, tmp_path: Path, screenshot: Any
) -> None:
    """A server of its own, stopped and started again on the same port under the open page."""
    from servers import free_port

    port = free_port()
    env = {
        **server_env(),
        "ROUNDTRIP_MODELS": json.dumps([{"id": "tiny", "path": str(tiny_model_path), "aliases": []}]),
        "ROUNDTRIP_SQLITE_PATH": str(tmp_path / "db.sqlite3"),
    }
    from servers import manage

    manage(env, "migrate", "--noinput")
    url = f"http://127.0.0.1:{port}"
    server = start(env, tmp_path / "a.log", "serve", "--port", str(port))
    wait_ready(url, [server], [tmp_path / "a.log"])
    context = browser.new_context(bypass_csp=True)
    page = context.new_page()
    try:
        page.goto(url + "/")
        page.wait_for_selector(".status.connected", timeout=15000)
        stop([server])
        page.wait_for_selector(".status.reconnecting", timeout=15000)
        assert "reconnecting" in page.inner_text("#socket-status")
        assert not page.is_visible("#model-loading"), page.inner_text("#model-loading")
        screenshot(page, "reconnecting")
        server = start(env, tmp_path / "b.log", "serve", "--port", str(port))
        wait_ready(url, [server], [tmp_path / "b.log"])
        page.wait_for_selector(".status.reconnected", timeout=20000)
        ask(page, "the heat is on", model="tiny")
        wait_done(page)
        assert answer(page) != ""
    finally:
        context.close()
        stop([server])


def test_an_unanswered_health_check_leaves_the_loading_box_to_the_socket_line(browser: Any, site_server: Any) -> None:
    """The page's first /health poll can still be in flight when the server goes away; that is the socket status
    line's news ("reconnecting"), not a model that is loading."""
    context = browser.new_context(bypass_csp=True)
    page = context.new_page()
    try:
        page.route("**/health", lambda route: route.abort())
        page.goto(site_server.url + "/")
        page.wait_for_selector(".status.connected", timeout=15000)
        page.wait_for_timeout(1000)  # two polls
        assert not page.is_visible("#model-loading"), page.inner_text("#model-loading")
    finally:
        context.close()


def test_tokens_faster_than_the_page_draws_are_never_lost(page: Any) -> None:
    """The tiny model makes hundreds of tokens a second: drawings may be skipped, tokens may not."""
    page.fill("#max_tokens", "200")
    page.fill("#temperature", "1")
    page.fill("#seed", "7")
    ask(page, "go", model="tiny")
    wait_done(page)
    # the page draws at its own pace (frames may be skipped): wait for the usage line, do not assume it is there
    page.wait_for_function(
        "document.querySelector('#stage-gateway [data-field=\"usage\"]').textContent.includes('tokens')", timeout=15000
    )
    shown = page.locator(".bubble.assistant .tok").count()
    usage = page.inner_text('#stage-gateway [data-field="usage"]')
    assert f"+ {shown} tokens" in usage or f"+ {shown + 1} tokens" in usage  # (+1: a final end-of-turn token)
    assert page.locator('#stage-stream [data-field="frames"] li').count() == min(40, shown)


def test_staff_watch_api_requests_live(browser: Any, site_server: Any, make_key: Any, screenshot: Any) -> None:
    from django.contrib.auth.models import User

    User.objects.create_superuser("boss", "boss@example.com", "a-long-password-1")
    context = browser.new_context(bypass_csp=True)
    page = context.new_page()
    try:
        page.goto(site_server.url + "/admin/login/?next=/watch/")
        page.fill("#id_username", "boss")
        page.fill("#id_password", "a-long-password-1")
        page.click("input[type=submit]")
        page.wait_for_selector(".status.connected", timeout=15000)
        page.wait_for_timeout(300)
        reply = httpx.post(
            f"{site_server.api}/chat/completions",
            headers={"Authorization": f"Bearer {make_key()}"},
            json={
                "model": "smollm2",
                "messages": [{"role": "user", "content": "What's the capital of India?"}],
                "temperature": 0,
            },
            timeout=60,
        )
        assert reply.status_code == 200
        page.wait_for_function("document.querySelector('#watch .bubble')?.textContent.length > 0", timeout=15000)
        page.wait_for_function("document.querySelector('#watch p').textContent.includes('tokens')", timeout=15000)
        assert page.inner_text("#watch .bubble") == reply.json()["choices"][0]["message"]["content"]
        assert reply.json()["id"] in page.inner_text("#watch h3")
        # every stage of the API request, traced at summary while staff watch: its tokens, context, sampling, loop
        page.wait_for_function(
            "document.querySelector('#stage-gateway [data-field=\"usage\"]').textContent.includes('tokens')",
            timeout=15000,
        )
        chip_ids = [
            int(i) for i in page.locator("#stage-tokens .chip").evaluate_all("nodes => nodes.map(n => n.dataset.id)")
        ]
        assert chip_ids == [1780, 506, 260, 3575, 282, 3089, 47]
        assert [
            li.split(" — ")[0] for li in page.locator('#stage-gateway [data-field="checks"] li').all_inner_texts()
        ] == ["authenticate", "rate_limit", "route", "usage_log"]
        assert page.locator("#stage-context .segment.message").inner_text() == "7"
        # once the run is done ("done" comes after "usage", and may be drawn a frame later) the token stages open on
        # the first token, not the last (<|im_end|>)
        page.wait_for_function(
            "document.querySelector('#stage-sampling .bar.chosen .tok')?.textContent === 'The'", timeout=15000
        )
        assert page.locator("#stage-loop .loop-strip li").count() == reply.json()["usage"]["completion_tokens"]
        assert page.locator('#stage-stream [data-field="frames"] li').count() >= 1 and page.inner_text(
            '#stage-detok [data-field="appended"]'
        )
        screenshot(page, "watch")

        # Responses and Messages traffic: each card names its API; the request stage shows the JSON as it came
        key = make_key()
        asked = {"model": "smollm2", "input": "The capital of France?", "max_output_tokens": 12, "temperature": 0}
        answered = httpx.post(f"{site_server.api}/responses", headers={"Authorization": f"Bearer {key}"}, json=asked)
        message = {"model": "smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
        assert httpx.post(f"{site_server.api}/messages", headers={"x-api-key": key}, json=message).status_code == 200
        page.wait_for_function("document.querySelectorAll('#watch .watch-card').length >= 3", timeout=15000)
        assert page.locator("#watch .watch-card h3 .api-name").all_inner_texts()[:3] == [
            "Anthropic Messages",
            "OpenAI Responses",
            "OpenAI Chat Completions",
        ]
        shown_json = '#stage-request [data-field="json"]'
        page.wait_for_function(f"document.querySelector('{shown_json}').textContent.includes('max_tokens')")
        assert json.loads(page.inner_text(shown_json)) == message
        assert "POST /v1/messages" in page.inner_text('#stage-request [data-field="api"]')
        page.locator("#watch .watch-card", has_text=answered.json()["id"]).locator("button.link").click()
        page.wait_for_function(f"document.querySelector('{shown_json}').textContent.includes('max_output_tokens')")
        assert json.loads(page.inner_text(shown_json)) == asked
        assert "(POST /v1/responses)" in page.inner_text('#stage-request [data-field="json-title"]')
        assert page.locator('#stage-request [data-explain="api"]').is_visible()
        assert not page.locator('#stage-request [data-explain="page"]').is_visible()
        page.wait_for_function(
            "document.querySelector('#stage-gateway [data-field=\"usage\"]').textContent.includes('tokens')",
            timeout=15000,
        )
        assert page.locator("#stage-tokens .chip").count() > 0  # every stage drawn, as for chat completions
        assert page.locator("#stage-loop .loop-strip li").count() == answered.json()["usage"]["output_tokens"]
        screenshot(page, "watch-responses")
    finally:
        context.close()


def test_the_watch_page_is_for_staff_only(page: Any, site_server: Any) -> None:
    page.goto(site_server.url + "/watch/")
    assert "/admin/login/" in page.url


def test_the_page_shows_the_model_loading_with_its_progress(browser: Any, tmp_path: Path, screenshot: Any) -> None:
    """A cold start (empty weights cache): the page says the model is loading, then that it is ready."""
    from servers import free_port, manage, share_kernels

    port = free_port()
    env = {
        **server_env(),
        "ROUNDTRIP_CACHE_DIR": str(share_kernels(tmp_path / "cold-cache")),
        "ROUNDTRIP_SQLITE_PATH": str(tmp_path / "db.sqlite3"),
        "ROUNDTRIP_MODELS": json.dumps([{"id": "smollm2-135m-instruct", "path": "", "aliases": []}]),
    }
    manage(env, "migrate", "--noinput")
    server = start(env, tmp_path / "server.log", "serve", "--port", str(port))
    context = browser.new_context(bypass_csp=True)
    page = context.new_page()
    try:
        url = f"http://127.0.0.1:{port}/"
        for _ in range(100):
            try:
                page.goto(url)
                break
            except Exception:
                page.wait_for_timeout(100)
        page.wait_for_selector("#model-loading:not([hidden])", timeout=15000)
        assert "Loading smollm2-135m-instruct" in page.inner_text("#model-loading")
        screenshot(page.locator(".chat"), "model-loading")
        page.wait_for_selector("#model-loading", state="hidden", timeout=120000)
    finally:
        context.close()
        stop([server])


def test_a_second_turn_shows_the_positions_the_prefix_cache_supplied(page: Any, screenshot: Any) -> None:
    ask(page, "What's the capital of India?")
    wait_done(page)
    ask(page, "And what is the capital of France?")
    wait_done(page)
    cache = page.inner_text('#stage-context [data-field="cache"]')
    assert "were reused from an earlier request" in cache and "of prefill saved" in cache
    assert page.locator("#stage-context .fill-bar .cached").count() == 1
    screenshot(page.locator("#stage-context"), "context-prefix-cache")


def test_a_full_batch_makes_the_page_say_it_waits_and_then_it_runs(
    page: Any, site_server: Any, make_key: Any, screenshot: Any
) -> None:
    """The test server decodes 4 sequences at once: with 4 long API streams running, a page turn waits its turn."""
    import threading

    key = make_key()
    started = [threading.Event() for _ in range(4)]

    def hog(i: int) -> None:
        body = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": f"story {i}"}],
            "max_tokens": 60,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream(
            "POST",
            f"{site_server.api}/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        ) as r:
            for line in r.iter_lines():
                if '"content"' in line:
                    started[i].set()

    hogs = [threading.Thread(target=hog, args=(i,)) for i in range(4)]
    for thread in hogs:
        thread.start()
    try:
        for event in started:
            assert event.wait(60)
        ask(page, "What's the capital of India?")
        page.wait_for_selector('#stage-gateway [data-field="queue"]:not([hidden])', timeout=20000)
        assert page.inner_text('#stage-gateway [data-field="queue"]').startswith("server busy")
        screenshot(page.locator("#stage-gateway"), "gateway-server-busy")
        wait_done(page)
        assert answer(page) == "The capital of India is New Delhi."
        assert page.is_hidden('#stage-gateway [data-field="queue"]')
    finally:
        for thread in hogs:
            thread.join(120)


def test_a_json_answer_shows_the_tokens_the_grammar_cut(page: Any, screenshot: Any) -> None:
    page.select_option("#response_format", "json_object")
    page.fill("#max_tokens", "400")
    ask(page, "Give the name and the country of the capital of France, as JSON.")
    wait_done(page)
    assert isinstance(json.loads(answer(page)), dict)
    decision = page.inner_text('#stage-sampling [data-field="decision"]')
    assert "the grammar cut" in decision and "mask" in decision
    # the last draw: the JSON was complete, so only end-of-turn could follow and the model's other guesses were cut
    assert "cut by grammar" in page.inner_text('#stage-sampling [data-field="bars"]')
    screenshot(page.locator("#stage-sampling"), "sampling-grammar")


def test_the_page_runs_under_its_content_security_policy(browser: Any, site_server: Any) -> None:
    """The policy enforced (no bypass): the page connects, answers and draws its charts, with no violation reported.
    Waits use locators only (Playwright's string predicates would need eval)."""
    context = browser.new_context()
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on(
        "console", lambda message: problems.append(message.text) if "Content Security Policy" in message.text else None
    )
    try:
        response = page.goto(site_server.url + "/")
        assert response is not None and "script-src 'self'" in response.headers["content-security-policy"]
        page.locator(".status.connected").wait_for(timeout=15000)
        page.check("#greedy")
        ask(page, "What's the capital of India?")
        page.locator(".bubble.assistant .answer", has_text="New Delhi").wait_for(timeout=60000)
        page.locator("#send:not([disabled])").wait_for(timeout=60000)
        page.goto(site_server.url + "/bench/")
        page.locator("body").wait_for()
    finally:
        context.close()
    assert problems == []
