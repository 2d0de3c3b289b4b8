"""Many streams at once: Roundtrip's server beside llama.cpp's llama-server, same GGUF, same client, same run.

    python benchmarks/bench_serving.py [--levels 1,2,4,8,16,32] [--max-tokens 128] [--rounds 2]

Starts `manage.py serve` (a fresh SQLite file, an unlimited API key), drives it over HTTP
with N concurrent streaming clients per level (each sends `--rounds` requests one after
another; distinct prompts; greedy; `ignore_eos` so every answer is exactly `--max-tokens`
tokens), stops it, then does the same against llama-server (`--parallel` = the highest
level) built by ../shared/tools/llamacpp-reference. Loopback only. Per level it prints
aggregate output tokens/s, time to first token and inter-token latency (p50, p99), all
measured on the client with time.perf_counter (a lean client, `benchmarks.lean_stream`, the same
for both servers), and, for Roundtrip, from its /metrics over the level: the mean engine step, the
mean delivery of a step's tokens by the web side (the engine waits for it, so an ITL is about the
two together, plus the client's reading) and the mean batch; then it checks the bars of the
batching issue.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import httpx2 as httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "tests"))

from servers import NotReady, free_port, manage, start, stop, wait_ready  # noqa: E402  (the tests' server helpers)

from benchmarks.lean_stream import HTTPStatusError, IncompleteAnswer, post_lines  # noqa: E402
from webapp.benchmark.measure import RequestResult  # noqa: E402

LLAMACPP = Path.home() / ".cache" / "llamacpp-reference"
TOPICS = [
    "a lighthouse keeper",
    "the first moon landing",
    "a clockmaker's apprentice",
    "a city under the sea",
    "an old violin",
    "a desert caravan",
    "a robot learning to paint",
    "the last library",
    "a storm at sea",
    "a mountain village",
    "a time traveller's diary",
    "a garden on Mars",
    "a lost dog finding home",
    "the invention of paper",
    "a night train",
    "a chess tournament",
]


@dataclass
class Level:
    streams: int
    results: list[RequestResult]
    seconds: float
    # the server's own step clock over the level, where it has one
    engine: dict[str, float] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(r.output_tokens for r in self.results)

    def stat(self, values: list[float], q: float) -> float:
        return (
            statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]
            if len(values) > 1
            else (values[0] if values else float("nan"))
        )

    def row(self) -> dict[str, float]:
        ttfts = [r.ttft for r in self.results if r.ttft is not None]
        gaps = [g for r in self.results for g in r.itls()]  # per token, as `manage.py bench` counts them
        return {
            "streams": self.streams,
            "requests": len(self.results),
            "errors": sum(bool(r.error) for r in self.results),
            "tok_s": self.tokens / self.seconds,
            "ttft_p50": self.stat(ttfts, 50),
            "ttft_p99": self.stat(ttfts, 99),
            "itl_p50": self.stat(gaps, 50),
            "itl_p99": self.stat(gaps, 99),
            **self.engine,
        }


def engine_totals(url: str) -> dict[str, float] | None:
    """Roundtrip's step counters from /metrics (sums over models): how many batched forwards, their seconds and rows.
    None for a server without them (llama-server)."""
    try:
        reply = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=5)
    except httpx.HTTPError:
        return None
    if reply.status_code != 200:
        return None
    totals = {"steps": 0.0, "step_seconds": 0.0, "delivery_seconds": 0.0, "rows": 0.0}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            if sample.name == "roundtrip_step_seconds_count":
                totals["steps"] += sample.value
            elif sample.name == "roundtrip_step_seconds_sum":
                totals["step_seconds"] += sample.value
            elif sample.name == "roundtrip_step_delivery_seconds_sum":
                totals["delivery_seconds"] += sample.value
            elif sample.name == "roundtrip_batch_size_sum":
                totals["rows"] += sample.value
    return totals


def engine_row(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """The level's mean engine step (forward and sampling, on the server's clock), the mean delivery of a step's tokens
    by the web side (which the engine waits for) and the mean batch: an ITL is about step + delivery, plus the client's
    own reading."""
    if before is None or after is None or after["steps"] <= before["steps"]:
        return {}
    steps = after["steps"] - before["steps"]
    return {
        "step_ms": (after["step_seconds"] - before["step_seconds"]) / steps * 1000,
        "delivery_ms": (after["delivery_seconds"] - before["delivery_seconds"]) / steps * 1000,
        "batch": (after["rows"] - before["rows"]) / steps,
    }


def upstream_reported(chunk: dict[str, Any]) -> dict[str, float] | None:
    """llama-server's own account of a request's time (`timings`: `prompt_ms` is its prefill), from its chunk or, for
    a gateway in front of it, from the gateway's `roundtrip_timings` (`upstream_reported`); None where a chunk has
    neither (LiteLLM's proxy passes it on in neither)."""
    reported = chunk.get("timings") or (chunk.get("roundtrip_timings") or {}).get("upstream_reported")
    return reported if isinstance(reported, dict) and "prompt_ms" in reported else None


async def one_request(url: str, key: str, model: str, prompt: str, max_tokens: int, index: int) -> RequestResult:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = RequestResult(index, "", time.perf_counter())
    try:
        async for line in post_lines(f"{url}/chat/completions", body, {"Authorization": f"Bearer {key}"}):
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                result.output_tokens = chunk["usage"]["completion_tokens"]
            if reported := upstream_reported(chunk):
                result.server_ttft = reported["prompt_ms"] / 1000
            if "error" in chunk:
                result.error = chunk["error"].get("code") or "error"
            if any(choice["delta"].get("content") for choice in chunk.get("choices", [])):
                result.chunk_times.append(now)
        result.ended = time.perf_counter()
    except HTTPStatusError as exc:
        result.error = str(exc)
    except (OSError, IncompleteAnswer, ValueError) as exc:
        result.error = type(exc).__name__
    return result


async def run_level(url: str, key: str, model: str, streams: int, rounds: int, max_tokens: int, offset: int) -> Level:
    prompts = iter(
        f"Request {offset + i}: write a long, detailed story about {TOPICS[(offset + i) % len(TOPICS)]}."
        for i in range(streams * rounds)
    )
    results: list[RequestResult] = []

    async def stream_client() -> None:
        for _ in range(rounds):
            results.append(await one_request(url, key, model, next(prompts), max_tokens, len(results)))

    started = time.perf_counter()
    await asyncio.gather(*(stream_client() for _ in range(streams)))
    return Level(streams, results, time.perf_counter() - started)


def sweep(name: str, url: str, key: str, model: str, levels: list[int], rounds: int, max_tokens: int) -> list[Level]:
    asyncio.run(run_level(url, key, model, 1, 1, 8, 10_000))  # warm-up, not counted
    out = []
    for i, streams in enumerate(levels):
        before = engine_totals(url)
        level = asyncio.run(run_level(url, key, model, streams, rounds, max_tokens, offset=1000 * i))
        level.engine = engine_row(before, engine_totals(url))
        out.append(level)
        r = level.row()
        print(
            f"  {name:<12} {streams:>3} streams: {r['tok_s']:7.1f} tok/s, TTFT p50 {r['ttft_p50'] * 1000:7.0f} ms, "
            f"ITL p50 {r['itl_p50'] * 1000:6.1f} ms p99 {r['itl_p99'] * 1000:6.1f} ms, errors {r['errors']}",
            file=sys.stderr,
            flush=True,
        )
    return out


class Target(NamedTuple):
    url: str  # the API's base URL (.../v1)
    key: str
    pid: int


@contextmanager
def roundtrip_server(workdir: Path, levels: list[int], model_path: str, root: Path = ROOT) -> Iterator[Target]:
    """`manage.py serve` of the checkout at `root` (this one, or another for an A/B run), with an unlimited key; a
    batch as large as the largest level (the default, 32, for the default levels)."""
    env = {
        **os.environ,
        "ROUNDTRIP_SQLITE_PATH": str(workdir / "db.sqlite3"),
        "ROUNDTRIP_DEBUG": "0",
        "ROUNDTRIP_SECRET_KEY": "bench",
        "ROUNDTRIP_MAX_BATCH": str(max(levels)),
        "PYTHONUNBUFFERED": "1",
        "ROUNDTRIP_GEMMA": "0",  # the model under test alone
    }
    if model_path:
        env["ROUNDTRIP_MODEL_PATH"] = model_path
    manage(env, "migrate", "--noinput", root=root)
    key = manage(
        env, "createapikey", "bench", "--rpm", "0", "--tpm", "0", "--concurrent", "0", "--budget", "0", root=root
    )
    port = free_port()
    log = workdir / "roundtrip.log"
    process = start(env, log, "serve", "--port", str(port), root=root)
    try:
        wait_ready(f"http://127.0.0.1:{port}", [process], [log], timeout=300)
        yield Target(f"http://127.0.0.1:{port}/v1", key.strip().split()[-1], process.pid)
    finally:
        stop([process])


@contextmanager
def llama_server(
    workdir: Path, levels: list[int], model_path: str, threads: int, cpus: set[int] | None = None
) -> Iterator[Target | None]:
    """llama-server on `model_path` with a slot per stream of the highest level; confined to `cpus` when given."""
    binary = LLAMACPP / "bin" / "llama-server"
    if not binary.exists():
        print(f"llama-server not found at {binary}: run ../shared/tools/llamacpp-reference", file=sys.stderr)
        yield None
        return
    port = free_port()
    log = workdir / "llama-server.log"
    parallel = max(levels)
    command = [
        str(binary),
        "-m",
        model_path,
        "-t",
        str(threads),
        "--parallel",
        str(parallel),
        "-c",
        str(parallel * 512),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            env={**os.environ, "LD_LIBRARY_PATH": str(LLAMACPP / "lib")},
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
    try:
        try:
            wait_ready(f"http://127.0.0.1:{port}", [process], [log], timeout=300)
        except NotReady:
            if process.returncode == -signal.SIGILL:
                raise SystemExit(
                    f"{binary} died of an illegal instruction: it was built for an instruction set this CPU lacks "
                    "(the reference script builds with -DGGML_AVX512=ON; rebuild with -DGGML_AVX512=OFF here)"
                ) from None
            raise
        yield Target(f"http://127.0.0.1:{port}/v1", "none", process.pid)
    finally:
        stop([process])


def model_file(name_or_path: str) -> str:
    """The GGUF a `--model` names: a path, a bundled model's name (gemma3-270m, smollm2), or "" for the default."""
    sys.path.insert(0, str(ROOT))
    from inference.loader import model_path

    return model_path(name_or_path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,2,4,8,16,32", help="concurrent streams, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="requests each stream sends, one after another")
    parser.add_argument(
        "--model", default="", help="GGUF file or bundled model (gemma3-270m; default: SmolLM2-135M-Instruct)"
    )
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument("--output", help="write the table as JSON here")
    parser.add_argument("--root", type=Path, default=ROOT, help="serve another checkout of Roundtrip (an A/B run)")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    model_path = model_file(args.model)
    threads = os.cpu_count() or 2
    table: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="roundtrip-bench-") as tmp:
        workdir = Path(tmp)
        with roundtrip_server(workdir, levels, args.model, args.root) as target:
            table["roundtrip"] = [
                lv.row()
                for lv in sweep("roundtrip", target.url, target.key, "smollm2", levels, args.rounds, args.max_tokens)
            ]
        if not args.skip_llamacpp:
            with llama_server(workdir, levels, model_path, threads) as target:
                if target is not None:
                    table["llama-server"] = [
                        lv.row()
                        for lv in sweep(
                            "llama-server", target.url, "none", "default", levels, args.rounds, args.max_tokens
                        )
                    ]
    report(table, levels, args.max_tokens, model_path, threads)
    if args.output:
        Path(args.output).write_text(json.dumps(table, indent=2))


def report(
    table: dict[str, list[dict[str, float]]], levels: list[int], max_tokens: int, model_path: str, threads: int
) -> None:
    print(
        f"\nmodel {model_path}; {max_tokens} output tokens per request (ignore_eos, greedy); {threads} CPU threads; "
        "client on the same machine"
    )
    header = (
        f"{'server':<14}{'streams':>8}{'requests':>9}{'tok/s':>9}{'TTFT p50':>10}{'TTFT p99':>10}"
        f"{'ITL p50':>9}{'ITL p99':>9}{'errors':>7}"
        f"{'step avg':>10}{'delivery':>10}{'batch':>7}"
    )
    print(header)
    for name, rows in table.items():
        for r in rows:
            print(
                f"{name:<14}{r['streams']:>8}{r['requests']:>9}{r['tok_s']:>9.1f}"
                f"{r['ttft_p50'] * 1000:>8.0f}ms{r['ttft_p99'] * 1000:>8.0f}ms"
                f"{r['itl_p50'] * 1000:>7.1f}ms{r['itl_p99'] * 1000:>7.1f}ms{r['errors']:>7}"
                + (f"{r['step_ms']:>8.1f}ms{r['delivery_ms']:>8.1f}ms{r['batch']:>7.1f}" if "step_ms" in r else "")
            )
    ours = {r["streams"]: r for r in table.get("roundtrip", [])}
    theirs = {r["streams"]: r for r in table.get("llama-server", [])}
    if 1 in ours and 8 in ours:
        print(f"\naggregate at 8 streams / single stream: {ours[8]['tok_s'] / ours[1]['tok_s']:.2f}x (bar: >= 3)")
        print(
            f"ITL p99 at 8 streams / single-stream ITL p50: {ours[8]['itl_p99'] / ours[1]['itl_p50']:.2f}x (bar: <= 2)"
        )
    if 1 in theirs and 8 in theirs:  # the same two measures of llama-server in the same run, for scale
        print(
            f"  llama-server, for scale: {theirs[8]['tok_s'] / theirs[1]['tok_s']:.2f}x aggregate, "
            f"{theirs[8]['itl_p99'] / theirs[1]['itl_p50']:.2f}x ITL"
        )
    if 16 in ours and 16 in theirs:
        print(
            f"aggregate at 16 streams, roundtrip / llama-server: {ours[16]['tok_s'] / theirs[16]['tok_s']:.2f}x (bar: "
            ">= 2)"
        )


if __name__ == "__main__":
    main()
