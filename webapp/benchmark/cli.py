"""`python -m webapp.benchmark` / `python manage.py bench`: latency and throughput of any OpenAI-compatible server.

    python -m webapp.benchmark --url http://127.0.0.1:8000/v1 --api-key rt-... --concurrency 1,4,16 --requests 32
    python manage.py bench --model smollm2,far-away --concurrency 1,8     # several models behind one gateway
    python manage.py bench --target http://127.0.0.1:8080/v1 default --target http://127.0.0.1:8000/v1 smollm2 KEY_ENV

Streams every request over SSE and times it on the client (see `webapp.benchmark.measure` for what
starts and stops each clock). Warm-up requests are sent first and left out. Bounded: at most
MAX_REQUESTS per level and `--max-duration` seconds per level. Any URL is accepted — measuring a
remote provider is a use this tool is for — so point it only at servers you may load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx2 as httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from webapp.benchmark.client import Endpoint
from webapp.benchmark.measure import Targets
from webapp.benchmark.report import print_table, write_files
from webapp.benchmark.runner import Level, LevelRun, Settings, run_level
from webapp.benchmark.workload import Length, build_items

MAX_REQUESTS = 10_000
MAX_CONCURRENCY = 1024


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench", description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the server's /v1 base URL")
    p.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY", ""), help="bearer key (default $OPENAI_API_KEY)"
    )
    p.add_argument("--model", default="default", help="a model, or a comma list: each is swept in turn at --url")
    p.add_argument(
        "--target",
        nargs="+",
        action="append",
        metavar=("URL", "MODEL"),
        help="URL MODEL [KEY_ENV]: a server to sweep (repeat for several; instead of --url and --model); its key from "
        "the environment variable KEY_ENV, else --api-key",
    )
    p.add_argument("--requests", type=int, default=32, help="requests per level (not counting warm-up)")
    p.add_argument(
        "--concurrency", default="", help="concurrent clients: one level or a comma list for a sweep (default 1)"
    )
    p.add_argument(
        "--rate",
        default="",
        help="requests per second (Poisson arrivals): one or a comma list; instead of --concurrency",
    )
    p.add_argument(
        "--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps: 1 Poisson, <1 burstier"
    )
    p.add_argument("--max-tokens", default="128", help="output tokens: N, or LOW:HIGH drawn uniformly")
    p.add_argument("--prompt-tokens", default="128", help="prompt tokens of synthetic prompts: N or LOW:HIGH")
    p.add_argument(
        "--dataset", type=Path, help="JSONL prompts ({'prompt': ...} or ShareGPT records) instead of synthetic ones"
    )
    p.add_argument("--warmup", type=int, default=2, help="requests sent first and left out")
    p.add_argument(
        "--no-ignore-eos", dest="ignore_eos", action="store_false", help="let the model stop early (lengths then vary)"
    )
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--goodput-ttft", type=float, help="goodput target: TTFT at most this many ms")
    p.add_argument("--goodput-tpot", type=float, help="goodput target: time per output token at most this many ms")
    p.add_argument("--goodput-e2e", type=float, help="goodput target: end-to-end at most this many ms")
    p.add_argument(
        "--goodput-itl",
        type=float,
        help="goodput target: the request's 90th-percentile inter-token gap at most this many ms",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    p.add_argument("--max-duration", type=float, default=600.0, help="seconds per level at most")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--output", type=Path, help="JSON file of every request and the summary; CSV and PNG plots beside it"
    )
    return p


def levels(args: argparse.Namespace) -> list[Level]:
    if args.rate and args.concurrency:
        raise SystemExit("choose --concurrency or --rate, not both")
    if args.rate:
        return [Level(rate=float(r), burstiness=args.burstiness) for r in args.rate.split(",")]
    values = [int(c) for c in (args.concurrency or "1").split(",")]
    if any(not 1 <= c <= MAX_CONCURRENCY for c in values):
        raise SystemExit(f"--concurrency must be between 1 and {MAX_CONCURRENCY}")
    return [Level(concurrency=c) for c in values]


def endpoints(args: argparse.Namespace) -> list[Endpoint]:
    """What the run sweeps: each --target, or each model of --model at --url."""
    if not args.target:
        return [Endpoint(args.url.rstrip("/"), args.api_key, model) for model in args.model.split(",") if model]
    found = []
    for target in args.target:
        if len(target) not in (2, 3):
            raise SystemExit("--target takes URL MODEL [KEY_ENV]")
        key = args.api_key
        if len(target) == 3:
            if target[2] not in os.environ:
                raise SystemExit(f"--target {target[0]}: the environment variable {target[2]} is not set")
            key = os.environ[target[2]]
        found.append(Endpoint(target[0].rstrip("/"), key, target[1]))
    return found


async def run(args: argparse.Namespace, console: Console) -> tuple[list[LevelRun], list[dict[str, Any]]]:
    runs, summaries = [], []
    swept = endpoints(args)
    for endpoint in swept:
        label = f"{endpoint.model} at {endpoint.url}" if len(swept) > 1 else ""
        found = await run_target(args, console, endpoint, label)
        runs += found[0]
        summaries += found[1]
    return runs, summaries


async def run_target(
    args: argparse.Namespace, console: Console, endpoint: Endpoint, label: str
) -> tuple[list[LevelRun], list[dict[str, Any]]]:
    """Every level against one server and model (`label` names it when a run sweeps several)."""
    settings = Settings(args.ignore_eos, args.temperature, args.timeout, args.max_duration)
    targets = Targets(
        *(
            None if v is None else v / 1000
            for v in (args.goodput_ttft, args.goodput_tpot, args.goodput_e2e, args.goodput_itl)
        )
    )
    prompt_tokens, max_tokens = Length.parse(args.prompt_tokens), Length.parse(args.max_tokens)
    runs, summaries = [], []
    async with httpx.AsyncClient(timeout=60) as client:
        warmup = (
            await build_items(client, endpoint, args.warmup, prompt_tokens, Length(8, 8), args.seed + 1, args.dataset)
            if args.warmup
            else []
        )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        if warmup:
            task = bar.add_task(f"{label} warm-up".strip(), total=len(warmup))
            await run_level(endpoint, Level(concurrency=1), warmup, settings, args.seed, lambda r: bar.advance(task))
        for i, level in enumerate(args.levels):
            async with httpx.AsyncClient(timeout=60) as client:
                items = await build_items(
                    client, endpoint, args.requests, prompt_tokens, max_tokens, args.seed + 100 * i, args.dataset
                )
            task = bar.add_task(f"{label} {level.name}".strip(), total=len(items))
            level_run = await run_level(
                endpoint,
                level,
                items,
                settings,
                args.seed + i,
                lambda r, task=task: bar.advance(task),  # type: ignore[misc]
            )
            level_run.target = label
            runs.append(level_run)
            summaries.append(level_run.summary(targets))
    return runs, summaries


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not 1 <= args.requests <= MAX_REQUESTS:
        raise SystemExit(f"--requests must be between 1 and {MAX_REQUESTS}")
    args.levels = levels(args)
    console = Console(stderr=True)
    runs, summaries = asyncio.run(run(args, console))
    print_table(summaries, Console())
    if args.output:
        meta = {
            "targets": [{"url": e.url, "model": e.model} for e in endpoints(args)],
            "requests": args.requests,
            "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens,
            "ignore_eos": args.ignore_eos,
            "dataset": str(args.dataset or ""),
            "seed": args.seed,
        }
        for path in write_files(args.output, runs, summaries, meta):
            console.print(f"wrote {path}")
    failed = sum(s["requests"] - s["succeeded"] for s in summaries)
    return 1 if failed and failed == sum(s["requests"] for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
