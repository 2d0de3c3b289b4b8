"""The benchmark page in real headless Chromium: it measures real streams in the browser, its numbers agree with the
server's usage log, a saved result opens read-only at its link, and exports download."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from webapp.usage.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def bench(browser: Any, site_server: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1500, "height": 1100}, accept_downloads=True, bypass_csp=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(site_server.url + "/bench/")
    yield page
    context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


def run(page: Any, runs: int, model: str = "tiny", max_tokens: int = 8) -> None:
    page.select_option('.lane [name="model"]', model)
    page.fill('.lane [name="max_tokens"]', str(max_tokens))
    page.fill("#runs", str(runs))
    page.fill("#prompt", "Tell me about the sea.")
    page.click("#run")
    page.wait_for_function("document.getElementById('progress-text').textContent.includes('done')", timeout=60000)


def test_the_page_measures_streams_in_the_browser_and_agrees_with_the_usage_log(
    bench: Any, site_server: Any, screenshot: Any
) -> None:
    run(bench, runs=3)
    assert bench.inner_text('#summary td[data-col="ok"]') == "3/3"
    assert bench.locator("#charts canvas").count() >= 4  # TTFT, tokens/s, ITL by token, distribution
    screenshot(bench.locator("main"), "bench-page")
    bench.click("#save")
    link = bench.wait_for_selector('[data-field="permalink"]').get_attribute("href")
    saved = httpx.get(link.rstrip("/") + ".json", timeout=10).json()
    runs = saved["lanes"][0]["runs"]
    assert len(runs) == 3 and all(r["status"] == 200 and r["error"] == "" for r in runs)
    deadline = time.monotonic() + 10
    while (
        UsageRecord.objects.filter(request_id__in=[r["request_id"] for r in runs]).count() < 3
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    for r in runs:
        row = UsageRecord.objects.get(request_id=r["request_id"])
        assert row.status == 200 and row.completion_tokens == r["tokens"]
        # the browser's clock starts before the gateway's and ends after it
        assert 0 <= r["ttft_ms"] - row.ttft_ms < 1000
        assert r["server_ttft_ms"] is not None and r["server_ttft_ms"] <= r["ttft_ms"]


def test_a_saved_result_opens_read_only_at_its_link_and_exports(
    bench: Any, site_server: Any, browser: Any, screenshot: Any
) -> None:
    run(bench, runs=2)
    live_ttft = bench.inner_text('#summary td[data-col="ttft"]')
    bench.click("#save")
    link = bench.wait_for_selector('[data-field="permalink"]').get_attribute("href")
    bench.wait_for_selector(f'#saved a[href="/{link.split("/", 3)[3]}"]')  # the list (htmx) shows it
    other = browser.new_context(bypass_csp=True)  # someone else, with only the link
    page = other.new_page()
    page.goto(link)
    assert page.inner_text('#summary td[data-col="ttft"]') == live_ttft
    assert page.locator("#run").count() == 0  # read-only: nothing to run or change
    screenshot(page.locator("main"), "bench-result")
    with page.expect_download() as download:
        page.click("#card")
    assert download.value.suggested_filename.endswith(".png")
    csv_text = httpx.get(link.rstrip("/") + ".csv", timeout=10).text
    assert csv_text.splitlines()[0].startswith("lane,run,status") and len(csv_text.splitlines()) == 3
    other.close()
    with bench.expect_download() as exported:
        bench.click("#export-json")
    assert json.loads(Path(exported.value.path()).read_text())["lanes"][0]["runs"][0]["tokens"] == 8


def test_two_saved_results_compare_side_by_side(bench: Any, site_server: Any) -> None:
    for _ in range(2):
        run(bench, runs=1)
        bench.click("#save")
        bench.wait_for_selector('[data-field="permalink"]')
    bench.wait_for_function("document.querySelectorAll('#saved input[name=r]').length >= 2")
    boxes = bench.locator("#saved input[name=r]")
    boxes.nth(0).check()
    boxes.nth(1).check()
    with bench.context.expect_page() as opened:
        bench.click("#compare")
    compared = opened.value
    compared.wait_for_selector("#summary tbody tr")
    assert compared.locator('#summary td[data-col="lane"]').count() == 2
    assert compared.locator("#charts canvas").count() >= 4
