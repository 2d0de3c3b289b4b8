"""What Roundtrip's gateway adds in front of another server: llama.cpp's llama-server on the same GGUF, streamed to
directly and through the gateway (and through LiteLLM's proxy, when it is installed), by the same client, alternating.

    python benchmarks/bench_gateway.py [--levels 1,8] [--requests 100] [--max-tokens 64] [--litellm PATH]
                                       [--baseline-root CHECKOUT] [--upstream-cpus N]

Starts llama-server (built by ../shared/tools/llamacpp-reference; `--parallel` = the highest level) and a Roundtrip
gateway (`manage.py serve`, a fresh SQLite file, an unlimited key) whose only model is that llama-server, an upstream
entry of ROUNDTRIP_MODELS: every request passes the whole gateway (key, limits, route, usage row). With `--litellm`
(the `litellm` command of a venv with `litellm[proxy]`), LiteLLM's proxy in front of the same llama-server is
measured too, as the reference a deployment would otherwise use. With `--baseline-root` (another checkout of this
repository, say `git worktree add /tmp/before <commit>`), that checkout's gateway runs as one more target in the same
rounds ("baseline"): a change to the gateway is measured against the code before it under the same drift.

At one stream, requests go one at a time, cycling through the targets in an order that changes every round (every
target as often in every place and after every other: see `round_order`); at N streams, each round runs N concurrent
streams against one target, the targets taking turns in the same orders. Every request has its own prompt (so
llama-server's prompt cache helps none), greedy, `ignore_eos`, exactly
`--max-tokens` tokens. The client is `benchmarks.lean_stream` (the same for every target), on the same two cores;
with `--upstream-cpus 1`, llama-server has one core to itself (one thread) and the client and proxies the other, as a
gateway and its upstream would on two machines (see `split_cpus`).
Prints TTFT and ITL p50, aggregate tokens/s and each proxy's CPU time per output token (from /proc) per target and
level, what the gateway adds, and the issue's bars: at one stream at most +2 ms TTFT p50 and +0.3 ms ITL p50; at 8
streams at most 5 % less throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from servers import free_port, manage, start, stop, wait_ready  # noqa: E402  (the tests' server helpers)

from benchmarks.bench_serving import TOPICS, Target, llama_server, model_file, one_request  # noqa: E402
from webapp.benchmark.measure import RequestResult  # noqa: E402

BARS = {"ttft_ms": 2.0, "itl_ms": 0.3, "throughput_loss": 0.05}
# After each answer (and each round at more streams) the machine is left alone this long before the next request. A
# proxy keeps working after its answer has gone (Roundtrip writes its usage row, LiteLLM logs and costs the call),
# and on two shared cores that work lands on the next request, whichever target it goes to. The rounds' order gives
# every target that neighbour equally often, but not the same harm: a request straight to llama-server spends that
# time in llama-server's prefill (which the paired measure takes out), one through a gateway in the gateway's own
# work on its way in. Measured (docs/performance.md, the eleventh pass): with LiteLLM in the rounds and no pause, the
# gateway's TTFT less the prefill was +2.30 ms; in rounds without LiteLLM +1.12 ms; with LiteLLM and this pause +1.85.
SETTLE_SECONDS = 0.2


@contextmanager
def gateway(workdir: Path, upstream: Target, root: Path = ROOT) -> Iterator[Target]:
    """`manage.py serve` of the checkout at `root`, with one model, the llama-server upstream (no local model:
    nothing loads here)."""
    models = [{"id": "llama", "url": upstream.url, "upstream_model": "default", "aliases": []}]
    env = {
        **os.environ,
        "ROUNDTRIP_SQLITE_PATH": str(workdir / f"gateway-{abs(hash(root))}.sqlite3"),
        "ROUNDTRIP_DEBUG": "0",
        "ROUNDTRIP_SECRET_KEY": "bench",
        "ROUNDTRIP_MODELS": json.dumps(models),
        "PYTHONUNBUFFERED": "1",
    }
    manage(env, "migrate", "--noinput", root=root)
    key = manage(
        env, "createapikey", "bench", "--rpm", "0", "--tpm", "0", "--concurrent", "0", "--budget", "0", root=root
    )
    port = free_port()
    log = workdir / f"gateway-{abs(hash(root))}.log"
    process = start(env, log, "serve", "--port", str(port), root=root)
    try:
        wait_ready(f"http://127.0.0.1:{port}", [process], [log], timeout=120)
        yield Target(f"http://127.0.0.1:{port}/v1", key.strip().split()[-1], process.pid)
    finally:
        stop([process])


@contextmanager
def baseline_gateway(workdir: Path, upstream: Target, root: Path | None) -> Iterator[Target | None]:
    """The gateway of another checkout (`--baseline-root`), or None."""
    if root is None:
        yield None
        return
    with gateway(workdir, upstream, root.resolve()) as target:
        yield target


@contextmanager
def litellm_proxy(workdir: Path, command: str | None, upstream: Target) -> Iterator[Target | None]:
    """LiteLLM's proxy (`litellm --model openai/default --api_base ...`) in front of the same llama-server."""
    if not command:
        yield None
        return
    port = free_port()
    key = f"sk-bench-{secrets.token_hex(16)}"  # its proxy checks a key too, as Roundtrip's gateway does
    config = workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: llama\n"
        "    litellm_params:\n"
        "      model: openai/default\n"
        f"      api_base: {upstream.url}\n"
        "      api_key: none\n"
    )
    log = workdir / "litellm.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [command, "--config", str(config), "--port", str(port), "--host", "127.0.0.1", "--num_workers", "1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "LITELLM_LOG": "ERROR",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_MASTER_KEY": key,
            },
        )
    try:
        deadline = time.monotonic() + 120
        import httpx2 as httpx

        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None:
                raise RuntimeError(f"LiteLLM's proxy stopped:\n{log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield Target(f"http://127.0.0.1:{port}/v1", key, process.pid)
    finally:
        stop([process])


class Prompts:
    """Prompts of one length, none sharing more than the chat template's prefix with the one before.

    llama-server keeps each slot's last prompt and reuses its longest common prefix, and its prefill time grows with
    the prompt: a target given longer prompts, or prompts that share more with the one before, is measured slower for
    its prompts, not for the path to the server. So every request of a round (the same topic for every target) starts
    with its own number, its last digit first: five digits, one token each, which differ from the previous request's
    from the first token on."""

    def __init__(self) -> None:
        self.n = 0

    def next(self, round_: int) -> str:
        self.n += 1
        return f"{self.n % 10}{self.n:04d}: write a long, detailed story about {TOPICS[round_ % len(TOPICS)]}."


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process and every process under it, from /proc (LiteLLM's proxy runs its
    server in a child process)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo += children.get(current, [])
    return total


def round_order(names: list[str], round_: int) -> list[str]:
    """The targets' order in one round, the same for the same round in every run.

    A request can pay for the work a server does after the request before it (a gateway writes its usage row, LiteLLM
    its logs) while llama-server computes. The orders are the rows of a Williams design (with its mirror for an odd
    number of targets), each row once in every block of rounds, the blocks' orders shuffled: within a block every
    target runs once in every place and follows every other target equally often, even in the four rounds of the
    8-stream level; between rounds, who follows whom is left to chance. (Turned by one each round, with four targets
    each followed the same other target in three rounds of four: llama-server the baseline gateway, the baseline
    LiteLLM.)"""
    n = len(names)
    first, low, high = [0], 1, n - 1  # 0, 1, n-1, 2, n-2, ...: every difference between neighbours once
    while len(first) < n:
        if len(first) % 2:
            first, low = [*first, low], low + 1
        else:
            first, high = [*first, high], high - 1
    rows = [[(i + shift) % n for i in first] for shift in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    block, place = divmod(round_, len(rows))
    row = rows[random.Random(block).sample(range(len(rows)), len(rows))[place]]
    return [names[i] for i in row]


def split_cpus(count: int) -> tuple[set[int] | None, int]:
    """The CPUs llama-server gets and its thread count. With `count` CPUs of its own, this process (and every proxy
    it starts after) keeps the others.

    On two shared cores a request's time to first token wanders by tens of milliseconds: llama-server's two threads
    meet at a barrier after every step, so whichever other process runs for a moment (the client, a proxy writing the
    last request's usage row) holds both back. A millisecond the gateway adds is then lost in that spread. Apart, as
    a gateway and a GPU server would be on different machines, llama-server's time is steady and the gateway's own
    time stands out; what the gateway's CPU time costs a server on the same cores is what the shared run measures."""
    mine = sorted(os.sched_getaffinity(0))
    if not count:
        return None, len(mine)
    if count >= len(mine):
        raise SystemExit(f"--upstream-cpus {count} leaves none of this machine's {len(mine)} CPUs to the client")
    os.sched_setaffinity(0, mine[count:])
    return set(mine[:count]), count


def _p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def one_stream(
    targets: dict[str, tuple[Target, str]], requests: int, max_tokens: int, prompts: Prompts
) -> dict[str, list[RequestResult]]:
    """One request at a time, cycling through the targets in each round's order (`round_order`), each after the
    machine has settled from the one before (`SETTLE_SECONDS`)."""
    names = list(targets)
    out: dict[str, list[RequestResult]] = {name: [] for name in names}
    for i in range(requests):
        order = round_order(names, i)
        for name in order:
            target, model = targets[name]
            out[name].append(await one_request(target.url, target.key, model, prompts.next(i), max_tokens, i))
            await asyncio.sleep(SETTLE_SECONDS)
    return out


async def many_streams(
    targets: dict[str, tuple[Target, str]], streams: int, rounds: int, max_tokens: int, prompts: Prompts
) -> dict[str, tuple[list[RequestResult], float]]:
    """`rounds` rounds per target of `streams` concurrent requests, the targets taking turns; (results, seconds)."""
    out: dict[str, tuple[list[RequestResult], float]] = {name: ([], 0.0) for name in targets}
    names = list(targets)
    for r in range(rounds):
        for name in round_order(names, r):
            target, model = targets[name]
            started = time.perf_counter()
            results = await asyncio.gather(
                *(one_request(target.url, target.key, model, prompts.next(r), max_tokens, i) for i in range(streams))
            )
            results_so_far, seconds = out[name]
            out[name] = (results_so_far + list(results), seconds + time.perf_counter() - started)
            await asyncio.sleep(SETTLE_SECONDS)
    return out


def row(results: list[RequestResult], seconds: float = 0.0, cpu: float | None = None) -> dict[str, float]:
    """p50s, errors, aggregate tokens/s (over `seconds`, when given) and a proxy's CPU time per output token (`cpu`:
    the seconds its processes used meanwhile)."""
    ttfts = [r.ttft for r in results if r.ttft is not None]
    gaps = [g for r in results for g in r.itls()]
    tokens = sum(r.output_tokens for r in results)
    out = {
        "requests": len(results),
        "errors": sum(bool(r.error) for r in results),
        "ttft_p50_ms": _p50(ttfts) * 1000,
        "itl_p50_ms": _p50(gaps) * 1000,
    }
    prefills = [r.server_ttft for r in results if r.server_ttft is not None]
    if prefills:  # llama-server's own prefill time, as it reported it (through Roundtrip's gateway too)
        out["prefill_p50_ms"] = _p50(prefills) * 1000
        out["ttft_less_prefill_p50_ms"] = _p50([path for r in results if (path := _path(r)) is not None]) * 1000
    if seconds:
        out["tok_s"] = tokens / seconds
    if cpu is not None:
        out["cpu_us_per_token"] = cpu / max(tokens, 1) * 1e6
    return out


def median_interval(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95 % bootstrap interval for the median of `values`: how far the printed median could be from the one a
    longer run would give. Requests to llama-server differ from each other by tens of milliseconds in TTFT here, so a
    difference of medians over 100 pairs is only known to a few milliseconds; the interval says how many."""
    if not values:
        return float("nan"), float("nan")
    draw = random.Random(seed)
    medians = sorted(statistics.median(draw.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def _path(result: RequestResult) -> float | None:
    """A request's time to first token less llama-server's own prefill time, as it reported it: the way to the
    server and back, and the server's work around its prefill (parse, template, tokenizer, first sample)."""
    if result.ttft is None or result.server_ttft is None:
        return None
    return result.ttft - result.server_ttft


def paired(through: list[RequestResult], direct: list[RequestResult]) -> dict[str, float]:
    """At one stream, request i of every target has the same topic and prompt length and ran in the same round: the
    median over rounds of (through - direct) for TTFT and for the request's median ITL, each with its 95 % interval.
    llama-server's prefill time wanders by several milliseconds over a run; the difference of two targets' p50s
    carries that noise, the paired differences less of it.

    Here the prefill of 20 tokens takes 150-280 ms and two requests' differ by tens of milliseconds, even with
    llama-server alone on its core: that spread is the server's arithmetic, which the gateway neither causes nor
    shortens, yet it leaves a median of 100 pairs uncertain by several milliseconds. So where the target reports it
    (llama-server's `timings`, and Roundtrip's gateway passing them on), the pairs are also taken of TTFT less that
    prefill (`ttft_less_prefill_paired_ms`): what is left is the way there and back, which the gateway lengthens.
    With llama-server on the proxies' cores a proxy that slows its prefill is not seen in that difference (the
    prefill medians, printed beside it, show whether one did); with `--upstream-cpus` it cannot slow it."""
    pairs = [(t, d) for t, d in zip(through, direct, strict=True) if t.ttft is not None and d.ttft is not None]
    ttft = [(t.ttft - d.ttft) * 1000 for t, d in pairs if t.ttft is not None and d.ttft is not None]
    itl = [(_p50(t.itls()) - _p50(d.itls())) * 1000 for t, d in pairs if t.itls() and d.itls()]
    path = [(p - q) * 1000 for t, d in pairs if (p := _path(t)) is not None and (q := _path(d)) is not None]
    out = {"ttft_paired_ms": _p50(ttft), "itl_paired_ms": _p50(itl)}
    measured = [("ttft", ttft), ("itl", itl)]
    if path:
        out["ttft_less_prefill_paired_ms"] = _p50(path)
        measured.append(("ttft_less_prefill", path))
    for name, values in measured:
        out[f"{name}_paired_low_ms"], out[f"{name}_paired_high_ms"] = median_interval(values)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,8", help="concurrent streams, comma-separated (1 is one at a time)")
    parser.add_argument("--requests", type=int, default=100, help="requests per target at one stream")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per target at more streams")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", default="", help="GGUF file or bundled model (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--litellm", default=shutil.which("litellm"), help="LiteLLM's `litellm` command, if any")
    parser.add_argument("--output", help="write the table as JSON here")
    parser.add_argument("--baseline-root", type=Path, help="another checkout whose gateway runs beside this one")
    parser.add_argument(
        "--upstream-cpus",
        type=int,
        default=0,
        help="give llama-server this many CPUs of its own (and as many threads), the client and the proxies the rest; "
        "0 (the default): every process on every CPU",
    )
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    model_path = model_file(args.model)
    upstream_cpus, threads = split_cpus(args.upstream_cpus)
    table: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="roundtrip-gateway-bench-") as tmp:
        workdir = Path(tmp)
        with llama_server(workdir, levels, model_path, threads, upstream_cpus) as upstream:
            if upstream is None:
                raise SystemExit("llama-server is needed: run ../shared/tools/llamacpp-reference")
            with (
                gateway(workdir, upstream) as ours,
                litellm_proxy(workdir, args.litellm, upstream) as litellm,
                baseline_gateway(workdir, upstream, args.baseline_root) as baseline,
            ):
                targets = {"llama-server": (upstream, "default"), "roundtrip": (ours, "llama")}
                if litellm is not None:
                    targets["litellm"] = (litellm, "llama")
                if baseline is not None:
                    targets["baseline"] = (baseline, "llama")
                prompts = Prompts()
                asyncio.run(one_stream(targets, 3, 8, prompts))  # warm-up: connections, caches; not counted
                for level in levels:
                    before = {name: cpu_seconds(target.pid) for name, (target, _) in targets.items()}
                    if level == 1:
                        found = asyncio.run(one_stream(targets, args.requests, args.max_tokens, prompts))
                        timed = {name: (results, 0.0) for name, results in found.items()}
                    else:
                        timed = asyncio.run(many_streams(targets, level, args.rounds, args.max_tokens, prompts))
                    # one target streams at a time and a proxy is idle meanwhile: its CPU time is its own requests' work
                    # (llama-server's is every target's)
                    used: dict[str, float | None] = {
                        name: cpu_seconds(target.pid) - before[name] for name, (target, _) in targets.items()
                    }
                    used["llama-server"] = None
                    rows = {name: row(results, seconds, used[name]) for name, (results, seconds) in timed.items()}
                    if level == 1:
                        for name in rows.keys() - {"llama-server"}:
                            rows[name] |= paired(found[name], found["llama-server"])
                    table[str(level)] = rows
                    for name, r in rows.items():
                        print(
                            f"  {level} streams, {name}: {json.dumps({k: round(v, 3) for k, v in r.items()})}",
                            file=sys.stderr,
                        )
    report(table, model_path, args.max_tokens, upstream_cpus)
    if args.output:
        Path(args.output).write_text(json.dumps(table, indent=2))


def report(
    table: dict[str, dict[str, dict[str, float]]], model_path: str, max_tokens: int, upstream_cpus: set[int] | None
) -> None:
    where = (
        f"llama-server alone on CPUs {sorted(upstream_cpus)}, the client and the proxies on the others"
        if upstream_cpus
        else "every process on every CPU"
    )
    print(f"\nmodel {model_path}; {max_tokens} output tokens per request (ignore_eos, greedy); {where}")
    print(
        f"{'streams':>8} {'target':<14}{'requests':>9}{'errors':>7}{'TTFT p50':>11}{'ITL p50':>10}{'tok/s':>9}"
        f"{'CPU/token':>11}"
    )
    for level, rows in table.items():
        for name, r in rows.items():
            tok_s = f"{r['tok_s']:9.1f}" if "tok_s" in r else f"{'':>9}"
            cpu = f"{r['cpu_us_per_token']:9.0f}us" if "cpu_us_per_token" in r else ""
            print(
                f"{level:>8} {name:<14}{r['requests']:>9}{r['errors']:>7}{r['ttft_p50_ms']:>9.2f}ms"
                f"{r['itl_p50_ms']:>8.3f}ms{tok_s}{cpu}"
            )
    for proxy in ("roundtrip", "baseline", "litellm"):
        added = []
        if "1" in table and proxy in table["1"]:
            direct, through = table["1"]["llama-server"], table["1"][proxy]
            ttft = through["ttft_p50_ms"] - direct["ttft_p50_ms"]
            itl = through["itl_p50_ms"] - direct["itl_p50_ms"]
            bars = f" (bars: <= {BARS['ttft_ms']} ms, <= {BARS['itl_ms']} ms)" if proxy == "roundtrip" else ""
            added.append(
                f"1 stream: TTFT p50 {ttft:+.2f} ms, ITL p50 {itl:+.3f} ms{bars}; paired by round: TTFT "
                f"{through['ttft_paired_ms']:+.2f} ms (95 % interval {through['ttft_paired_low_ms']:+.2f} to "
                f"{through['ttft_paired_high_ms']:+.2f}), ITL {through['itl_paired_ms']:+.3f} ms "
                f"({through['itl_paired_low_ms']:+.3f} to {through['itl_paired_high_ms']:+.3f})"
            )
            if "ttft_less_prefill_paired_ms" in through:
                low, high = through["ttft_less_prefill_paired_low_ms"], through["ttft_less_prefill_paired_high_ms"]
                added.append(
                    f"TTFT less llama-server's own prefill: p50 "
                    f"{through['ttft_less_prefill_p50_ms'] - direct['ttft_less_prefill_p50_ms']:+.2f} ms, paired "
                    f"{through['ttft_less_prefill_paired_ms']:+.2f} ms ({low:+.2f} to {high:+.2f}); the prefill's own "
                    f"p50 {direct['prefill_p50_ms']:.2f} ms direct, {through['prefill_p50_ms']:.2f} ms through"
                )
        if "8" in table and proxy in table["8"]:
            loss = 1 - table["8"][proxy]["tok_s"] / table["8"]["llama-server"]["tok_s"]
            bar = f" (bar: <= {BARS['throughput_loss']:.0%})" if proxy == "roundtrip" else ""
            added.append(f"8 streams: throughput {-loss:+.1%}{bar}")
        if added:
            print(f"{proxy} adds: " + "; ".join(added))


if __name__ == "__main__":
    main()
