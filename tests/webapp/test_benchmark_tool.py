"""The benchmark tool against a live server (tiny model): every request accounted for, and its numbers agree with
the server's usage log — output tokens exactly; TTFT within 1 s (the client's clock also counts HTTP and the
loopback)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from webapp.benchmark.cli import main
from webapp.usage.models import UsageRecord


@pytest.mark.django_db(transaction=True)
def test_the_tool_measures_a_live_server_and_agrees_with_its_usage_log(
    site_server: Any, make_key: Any, tmp_path: Path
) -> None:
    output = tmp_path / "result.json"
    code = _main(
        [
            "--url",
            site_server.api,
            "--api-key",
            make_key(),
            "--model",
            "tiny",
            "--concurrency",
            "1,3",
            "--requests",
            "6",
            "--max-tokens",
            "8",
            "--prompt-tokens",
            "16",
            "--warmup",
            "1",
            "--output",
            str(output),
        ]
    )
    assert code == 0
    report = json.loads(output.read_text())
    assert [s["level"] for s in report["summary"]] == ["concurrency 1", "concurrency 3"]
    requests = report["requests"]
    assert len(requests) == 12 and all(r["error"] == "" for r in requests)
    # ignore_eos: exactly max_tokens, a gap per token
    assert all(r["output_tokens"] == 8 and len(r["itls"]) == 7 for r in requests)
    deadline = time.monotonic() + 10
    while (
        UsageRecord.objects.filter(request_id__in=[r["request_id"] for r in requests]).count() < 12
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    for r in requests:
        row = UsageRecord.objects.get(request_id=r["request_id"])
        assert row.status == 200 and row.completion_tokens == r["output_tokens"]
        assert row.prompt_tokens == r["prompt_tokens"]
        assert 0 <= r["ttft"] * 1000 - row.ttft_ms < 1000
    for suffix in (".csv", "-distributions.png", "-levels.png", "-itl-by-position.png"):
        assert (
            Path(str(output.with_suffix("")) + suffix if suffix != ".csv" else output.with_suffix(".csv"))
            .stat()
            .st_size
            > 0
        )
    summary = report["summary"][1]
    assert summary["succeeded"] == 6 and summary["output_tokens"] == 48
    assert summary["server"]["ttft"]["p50"] <= summary["ttft"]["p50"]  # the server's clock starts after the client's


def test_it_refuses_unbounded_or_contradictory_runs() -> None:
    with pytest.raises(SystemExit):
        _main(["--requests", "100000"])
    with pytest.raises(SystemExit):
        _main(["--concurrency", "2", "--rate", "3"])


def _main(argv: list[str]) -> int:
    """The tool runs its own event loop: give it a thread (Playwright's loop may own this one after the browser
    tests)."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(main, argv).result()
