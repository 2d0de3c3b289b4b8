"""The page on Gemma 3 270M, a base model of another architecture served beside SmolLM2: its model card in the file's
own numbers, "complete this text" chosen for it, every stage filled, the sliding-window layers shown."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from page_actions import STUDENT, answer, ask, chromium, open_page, wait_done, walk_the_tour
from servers import default_deployment

pytestmark = pytest.mark.live

LABEL = '#stage-forward [data-field="layer-label"]'


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with default_deployment(tmp_path_factory.mktemp("gemma-page")) as deployment:
        yield deployment.url


@pytest.fixture(scope="module")
def browser(gemma_server: str) -> Iterator[Any]:
    yield from chromium()


@pytest.fixture
def page(browser: Any, gemma_server: str) -> Iterator[Any]:
    context, page, errors = open_page(browser, gemma_server, STUDENT)
    yield page
    context.close()
    assert errors == [], f"JavaScript errors or Content-Security-Policy violations on the page: {errors}"


def test_the_model_card_names_gemmas_architecture_in_its_files_numbers(page: Any, screenshot: Any) -> None:
    page.select_option("#model", "gemma3-270m")
    page.wait_for_function("document.getElementById('model-card').textContent.includes('gemma3 architecture')")
    card = page.inner_text("#model-card")
    for fact in (
        "18 layers, width 640",
        "vocabulary 262,144 (SentencePiece)",
        "QK-norm",
        "GELU-gated",
        "15 of 18 layers see only the last 512 tokens",
        "No chat template",
    ):
        assert fact in card, fact
    cells = page.locator("#model-card .layer-cell")
    assert cells.count() == 18 and page.locator("#model-card .layer-cell.local").count() == 15
    assert cells.nth(3).get_attribute("title") == "layer 3: local attention, sees the last 512 tokens"
    assert page.input_value("#mode") == "complete"  # a base model: completing text is what it is for
    assert page.is_disabled("#system")  # a text to complete has no system prompt
    page.select_option("#model", "smollm2-135m-instruct")
    page.wait_for_function("document.getElementById('mode').value === 'chat'")
    assert page.is_enabled("#system")
    screenshot(page.locator("#settings"), "gemma-model-card")


def test_gemma_completes_text_with_every_stage_filled(page: Any, screenshot: Any) -> None:
    page.fill("#max_tokens", "8")
    ask(page, "The capital of India is", level="full", model="gemma3-270m")
    wait_done(page)
    assert answer(page).strip() == "the capital of the state of Uttar Pradesh"  # llama.cpp's first 8 tokens
    sent = json.loads(page.inner_text('#stage-request [data-field="json"]'))
    assert sent["prompt"] == "The capital of India is" and "messages" not in sent
    assert page.inner_text('#stage-request [data-field="api"]').startswith("POST /v1/completions")
    ids = page.locator("#stage-tokens .chip").evaluate_all("nodes => nodes.map(n => Number(n.dataset.id))")
    assert ids == [818, 5279, 529, 4673, 563]  # llama.cpp's ids for the text (its <bos> is markup in the context)
    chips = page.locator("#stage-tokens .chip .tok-text").all_inner_texts()
    assert chips == ["The", "▁capital", "▁of", "▁India", "▁is"]  # SentencePiece's own pieces
    assert page.locator("#stage-forward .layer").count() == 18
    assert "4 heads" in page.inner_text('#stage-forward [data-field="layer-label"]')
    windows = ((3, "local layer: sees the last 512 tokens (all"), (5, "global layer: sees every earlier token"))
    for layer, seen in windows:
        page.evaluate(
            """(layer) => { const pick = document.querySelector('#stage-forward [data-field="layer-pick"]');
                 pick.value = String(layer); pick.dispatchEvent(new Event("input")); }""",
            layer,
        )
        assert seen in page.inner_text('#stage-forward [data-field="layer-label"]')
    assert page.inner_text("#stage-sampling .bar.chosen .tok") == "·the"  # a space shown as ·
    for cell in ("ttft-client", "ttft-server", "itl-client", "itl-server"):
        assert page.inner_text(f'#stage-latency [data-field="{cell}"]').endswith("ms")
    # the tokenization stage's merges: SentencePiece's, over characters, its space written "▁"
    page.click('#stage-tokens details[data-more="bpe"] summary')
    page.fill('#stage-tokens [data-field="bpe-word"]', " capital🦙")
    page.click('#stage-tokens [data-field="bpe-go"]')
    page.wait_for_selector('#stage-tokens [data-field="bpe-steps"] .bpe-end')
    steps = page.inner_text('#stage-tokens [data-field="bpe-steps"]')
    assert "“▁capital🦙” starts as its 9 characters" in steps and "best-scored pair" in steps
    end = page.locator('#stage-tokens [data-field="bpe-steps"] .bpe-end').get_attribute("data-ids")
    assert end == "5279,478,397,404,391"  # "▁capital", then the llama's four UTF-8 bytes as byte-fallback tokens
    for stage in ("tokens", "forward", "sampling"):
        screenshot(page.locator(f"#stage-{stage}"), f"gemma-stage-{stage}")
    screenshot(page, "gemma-page")


def test_the_comparison_shows_both_tokenizations_and_both_distributions(
    browser: Any, gemma_server: str, screenshot: Any
) -> None:
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, bypass_csp=True)
    page = context.new_page()
    page.goto(gemma_server + "/compare/")
    page.wait_for_selector(".status.connected", timeout=15000)
    page.select_option("#model-a", "smollm2-135m-instruct")
    page.select_option("#model-b", "gemma3-270m")
    page.fill("#compare-text", "The capital of India is")
    page.click("#compare-run")
    page.wait_for_selector("#compare-next:not([hidden])", timeout=60000)
    sides = page.locator(".compare-side")
    assert sides.count() == 2
    smollm2_ids = sides.nth(0).locator(".chip").evaluate_all("nodes => nodes.map(n => Number(n.dataset.id))")
    gemma_ids = sides.nth(1).locator(".chip").evaluate_all("nodes => nodes.map(n => Number(n.dataset.id))")
    assert gemma_ids == [2, 818, 5279, 529, 4673, 563]  # <bos> and llama.cpp's ids
    assert len(smollm2_ids) == 5 and 2 not in smollm2_ids[:1]  # no BOS: SmolLM2's file does not ask for one
    assert "▁capital" in sides.nth(1).inner_text()  # SentencePiece pieces as the vocabulary writes them
    assert "both cut the text at 5 of 5 places" in page.inner_text("#compare-tokens")
    rows = page.locator("#compare-next tbody tr")
    assert rows.count() >= 10
    both = page.locator("#compare-next tbody tr.both")
    assert both.count() >= 1  # a next token both models rank, with both probabilities
    assert both.first.locator("td").all_inner_texts()[0].endswith("%")
    assert both.first.locator("td").all_inner_texts()[1].endswith("%")
    assert "·the" in page.locator("#compare-next tbody th").all_inner_texts()  # Gemma's likeliest, as in the chat
    screenshot(page, "compare-two-models")
    page.set_viewport_size({"width": 390, "height": 900})
    screenshot(page, "compare-two-models-390")
    context.close()


def test_the_guided_tour_runs_on_gemma(page: Any, screenshot: Any) -> None:
    """The tour's question goes to Gemma as text to complete; every stage is narrated with Gemma's own numbers."""
    page.select_option("#model", "gemma3-270m")
    page.wait_for_function("document.getElementById('mode').value === 'complete'")
    page.fill("#max_tokens", "8")
    page.click("#tour-start")
    said = walk_the_tour(page)
    wait_done(page)
    assert len(said) == 9
    assert "[3689, 236789, 236751, 506, 5279, 529, 4673, 236881]" in said[2]  # llama.cpp's ids for the question
    assert "your text (to be continued as it is" in said[0] and "system prompt" not in said[0]
    assert "no chat template, after the start-of-text token" in said[3] and "reads 9 tokens" in said[3]
    assert "all 18 layers" in said[4]
    assert "Time to first token" in said[-1]
    screenshot(page, "gemma-tour-end")


def test_the_attention_matrix_stripes_what_a_local_layer_cannot_see(page: Any, screenshot: Any) -> None:
    """A prompt longer than Gemma's 512-token window: in a local layer the first answer token's row is striped over
    the positions it no longer sees, and a global layer's is not."""
    page.fill("#max_tokens", "2")
    ask(page, "one two three four five six seven eight nine ten " * 60, level="full", model="gemma3-270m")
    wait_done(page)

    def first_cell(layer: int) -> str:
        page.evaluate(
            """(layer) => { const pick = document.querySelector('#stage-forward [data-field="layer-pick"]');
                 pick.value = String(layer); pick.dispatchEvent(new Event("input")); }""",
            layer,
        )
        canvas = page.locator('#stage-forward [data-field="matrix"] canvas')
        canvas.focus()
        canvas.press("Home")
        return page.locator('#stage-forward [data-field="matrix"] .hm-tip').inner_text()

    assert "outside this layer's window (it sees the last 512 positions)" in first_cell(0)
    assert "weight" in first_cell(5)
    first_cell(0)
    assert re.search(r"local layer: sees the last 512 tokens \(positions \d+–\d+\)", page.inner_text(LABEL))
    screenshot(page.locator('#stage-forward [data-field="matrix"]'), "gemma-window-matrix")
