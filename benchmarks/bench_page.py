"""The chat page's own cost: main-thread time per streamed token in headless Chromium, and a long answer through the
page beside the same request over SSE, in the same run.

    python benchmarks/bench_page.py [--tokens 256] [--levels summary,full] [--pipeline open,collapsed] [--root DIR]

Starts `manage.py serve` of the checkout at `--root` (this one by default; another for a before/after run) with
SmolLM2-135M-Instruct, opens the chat page in headless Chromium (the flags the tests use) and sends one message per
row: greedy, `max_tokens` = `--tokens`, and the end-of-turn token banned through the page's own `logit_bias` field,
so every answer is exactly that long. Per row it reads the CDP `Performance.getMetrics` counters before the send and
after the answer is drawn: `TaskDuration` (all main-thread work: script, style, layout, paint) over the answer's
tokens is the page's cost per token. The time through the page runs from the send to the first animation frame after
the answer ends. After each page run the same request (same system prompt, sampling and banned token) goes over SSE
with a lean blocking client while the page sits idle (in its tab and another); its time runs from the request to
`[DONE]`. Each is repeated `--repeats` times: medians are reported, and the ratio is the median of each page run over
the SSE run beside it (this machine's speed drifts over minutes). A page that reopens the last conversation is given
a new chat first, so that every request is the same. The browser, the server and the client share this machine's
cores, as a student's laptop would.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from page_actions import CHROMIUM, FLAGS  # noqa: E402  (tests/: the browser as the tests drive it)

from benchmarks.bench_serving import roundtrip_server  # noqa: E402
from benchmarks.lean_stream import post_lines_blocking  # noqa: E402

PROMPT = "Write a long, detailed story about a lighthouse keeper and the storm that changed her life."
SYSTEM = "You are a helpful assistant."
END_OF_TURN = 2  # SmolLM2's <|im_end|>: banned so that every answer runs to max_tokens
BARS = {"summary": 3.0, "full": 15.0}  # ms of main-thread time per token
SSE_BAR = 1.3

# Sets the page's fields, sends, and resolves when the answer is drawn: after `#send` was disabled by the send and
# enabled again by the end of the turn, at the next animation frame. Nothing polls meanwhile.
SEND = """async ([prompt, fields]) => {
  const $ = (id) => document.getElementById(id);
  for (const [id, value] of Object.entries(fields)) { const node = $(id); if (node) node.value = value; }
  const live = document.querySelector('input[name="speed"][value="live"]');
  if (live) live.checked = true;
  const send = $('send');
  let busy = false;
  const drawn = new Promise((resolve) => {
    const watch = new MutationObserver(() => {
      if (send.disabled) busy = true;
      else if (busy) { watch.disconnect(); requestAnimationFrame(() => resolve(performance.now())); }
    });
    watch.observe(send, { attributes: true, attributeFilter: ['disabled'] });
  });
  $('prompt').value = prompt;
  const started = performance.now();
  send.click();
  return (await drawn) - started;
}"""

NEW_CHAT = "() => document.getElementById('new-conversation')?.click()"

# The pipeline's state on a page that can collapse it (a page without the toggle is always open).
PIPELINE = """(want) => {
  const toggle = document.getElementById('pipeline-toggle');
  if (!toggle) return want === 'open';
  if ((toggle.getAttribute('aria-expanded') === 'true') !== (want === 'open')) toggle.click();
  return true;
}"""


@dataclass
class Row:
    level: str
    pipeline: str
    tokens: int
    task_ms: float  # main-thread time over the answer
    script_ms: float
    layout_ms: float
    style_ms: float
    wall_ms: float
    server_ttft_ms: float
    server_total_ms: float

    @property
    def per_token(self) -> float:
        return self.task_ms / max(self.tokens, 1)


def metrics(cdp: Any) -> dict[str, float]:
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def last_usage(db: Path) -> tuple[int, float, float]:
    """The latest usage row: completion tokens, and the server's own TTFT and total (ms)."""
    with sqlite3.connect(db) as connection:
        row = connection.execute(
            "SELECT completion_tokens, ttft_ms, total_ms FROM usage_usagerecord ORDER BY id DESC LIMIT 1"
        ).fetchone()
    return (int(row[0]), float(row[1] or 0), float(row[2] or 0)) if row else (0, 0.0, 0.0)


def through_page(page: Any, cdp: Any, db: Path, level: str, pipeline: str, tokens: int) -> Row:
    page.reload()
    page.wait_for_selector(".status.connected", timeout=30000)
    page.evaluate(NEW_CHAT)  # the page reopens the last conversation: every row asks without history, as SSE does
    if not page.evaluate(PIPELINE, pipeline):
        raise SystemExit(f"this page cannot show its pipeline {pipeline}")
    fields = {
        "level": level,
        "max_tokens": str(tokens),
        "temperature": "0",
        "top_p": "1",
        "top_k": "0",
        "seed": "",
        "min_p": "0",
        "repetition_penalty": "1",
        "logit_bias": json.dumps({str(END_OF_TURN): -100}),
        "system": SYSTEM,
    }
    before = metrics(cdp)
    wall = page.evaluate(SEND, [PROMPT, fields])
    after = metrics(cdp)
    spent = {name: (after[name] - before[name]) * 1000 for name in after if name.endswith("Duration")}
    tokens, ttft, total = last_usage(db)
    return Row(
        level,
        pipeline,
        tokens,
        spent["TaskDuration"],
        spent["ScriptDuration"],
        spent["LayoutDuration"],
        spent["RecalcStyleDuration"],
        wall,
        ttft,
        total,
    )


def over_sse(url: str, key: str, tokens: int) -> float:
    body = {
        "model": "smollm2",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}],
        "temperature": 0,
        "max_tokens": tokens,
        "logit_bias": {str(END_OF_TURN): -100},
        "stream": True,
    }
    started = time.perf_counter()
    for line in post_lines_blocking(f"{url}/chat/completions", body, {"Authorization": f"Bearer {key}"}):
        if line == b"data: [DONE]":
            break
    return (time.perf_counter() - started) * 1000


def median_row(rows: list[Row]) -> Row:
    pick = sorted(rows, key=lambda r: r.per_token)[len(rows) // 2]
    return Row(
        pick.level,
        pick.pipeline,
        pick.tokens,
        pick.task_ms,
        pick.script_ms,
        pick.layout_ms,
        pick.style_ms,
        statistics.median(r.wall_ms for r in rows),
        statistics.median(r.server_ttft_ms for r in rows),
        statistics.median(r.server_total_ms for r in rows),
    )


@dataclass
class Paired:
    """A row through the page, and the same request over SSE right after each of its runs (this machine's speed
    drifts over minutes: a ratio of neighbours is steadier than a ratio of medians taken minutes apart)."""

    row: Row
    sse_ms: float  # median over SSE
    ratio: float  # median of (through the page / over SSE), run by run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--levels", default="summary,full")
    parser.add_argument("--pipeline", default="open,collapsed", help="the pipeline's states to measure")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--root", type=Path, default=ROOT, help="serve another checkout of Roundtrip (before/after)")
    parser.add_argument("--output", help="write the rows as JSON here")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    os.environ["ROUNDTRIP_ANONYMOUS_LIMITS"] = "{}"  # the page is an anonymous visitor sending many long answers
    rows: list[Paired] = []
    with tempfile.TemporaryDirectory(prefix="roundtrip-page-") as tmp:
        workdir = Path(tmp)
        with roundtrip_server(workdir, [4], "", args.root) as target, sync_playwright() as playwright:
            site = target.url.removesuffix("/v1")
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            context = browser.new_context(viewport={"width": 1500, "height": 1000})
            idle = context.new_page()  # another tab with the page, open and doing nothing
            idle.goto(site + "/")
            page = context.new_page()
            cdp = context.new_cdp_session(page)
            cdp.send("Performance.enable")
            page.goto(site + "/")
            page.wait_for_selector(".status.connected", timeout=30000)
            through_page(page, cdp, workdir / "db.sqlite3", "summary", "open", 16)  # warm-up, not counted
            over_sse(target.url, target.key, 16)
            for level in args.levels.split(","):
                for pipeline in args.pipeline.split(","):
                    if level == "full" and pipeline == "collapsed":
                        continue  # full detail is for looking at the pipeline
                    runs, sse = [], []
                    for _ in range(args.repeats):
                        runs.append(through_page(page, cdp, workdir / "db.sqlite3", level, pipeline, args.tokens))
                        time.sleep(0.5)  # the page has nothing left to do: it sits idle while SSE runs
                        sse.append(over_sse(target.url, target.key, args.tokens))
                    row = median_row(runs)
                    ratio = statistics.median(r.wall_ms / t for r, t in zip(runs, sse, strict=True))
                    rows.append(Paired(row, statistics.median(sse), ratio))
                    print(f"  {level:<8} {pipeline:<10} {row.per_token:6.2f} ms/token {ratio:.2f}x", file=sys.stderr)
            browser.close()
    report(rows, args)
    if args.output:
        data = [{**p.row.__dict__, "sse_ms": p.sse_ms, "ratio": p.ratio} for p in rows]
        Path(args.output).write_text(json.dumps({"rows": data}, indent=2))


def report(rows: list[Paired], args: argparse.Namespace) -> None:
    print(
        f"\nchat page at {args.root}; SmolLM2-135M-Instruct, greedy, {args.tokens} tokens (end of turn banned); "
        f"headless Chromium; median of {args.repeats}; each page run followed by the same request over SSE"
    )
    print(
        f"{'level':<9}{'pipeline':<11}{'tokens':>7}{'main thread':>13}{'per token':>11}{'bar':>6}{'script':>9}"
        f"{'layout':>9}{'style':>9}{'page time':>11}{'SSE':>8}{'ratio':>7}{'bar':>6}{'server TTFT':>13}{'total':>9}"
    )
    for p in rows:
        r = p.row
        bar = f"{SSE_BAR:.1f}x" if r.level == "summary" else "-"
        print(
            f"{r.level:<9}{r.pipeline:<11}{r.tokens:>7}{r.task_ms:>11.0f}ms{r.per_token:>9.2f}ms{BARS[r.level]:>4.0f}ms"
            f"{r.script_ms:>7.0f}ms{r.layout_ms:>7.0f}ms{r.style_ms:>7.0f}ms{r.wall_ms:>9.0f}ms{p.sse_ms:>6.0f}ms"
            f"{p.ratio:>6.2f}x{bar:>6}{r.server_ttft_ms:>11.0f}ms{r.server_total_ms:>7.0f}ms"
        )


if __name__ == "__main__":
    main()
