"""Single-stream speed and memory: each weight format at each trace level, served, and beside llama.cpp on the same
file.

    python benchmarks/bench_inference.py [--model gemma3-270m] [--weights auto,int4,bf16,fp32,int8] [--skip-server]
        [--skip-llamacpp]

1. In-process, one child process per weight format (so each peak RSS is its own): prefill
   tokens/s of a whole prompt per length, and greedy decode tokens/s of one request alone in
   the scheduler (stop tokens ignored, so every run decodes the same count) at trace levels
   off, summary and full.
2. Served (`manage.py serve`, default settings): one streaming request through the API (SSE,
   read by a lean client, and again by httpx) and one chat turn over the page's WebSocket at
   `summary`, timed on the client from first to last token; the server's peak RSS. The in-process
   rate is measured again right after, and the served rates are compared with that one.
3. llama.cpp at its best on the same file and threads (`llamacpp_reference.py`; ../shared/tools/llamacpp-reference
   builds it): llama-bench's prompt processing and generation rates beside the in-process rows, and llama-server
   streaming one answer, read by the same client, beside the served rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inference.chat_template import Message  # noqa: E402

FILLER = (
    "The history of the printing press begins in the fifteenth century, when movable type changed how "
    "books were made, sold and read across Europe. "
)
STORY: list[Message] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tell me a long story about a dragon."},
]
LEVELS = ("off", "summary", "full")


def peak_rss_mib(pid: int | str = "self") -> float:
    """VmHWM: the most resident memory the process ever held."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def median_time(fn: Any, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def child(weights: str, lengths: list[int], n: int, repeats: int, model: str) -> dict[str, Any]:
    """One weight format, in this process: load, prefill, decode at each level."""
    import dataclasses

    import torch

    from inference.batch import Chunk
    from inference.engine import Engine
    from inference.loader import load_model
    from inference.params import SamplingParams
    from inference.sequence import SequenceRequest
    from inference.trace import Sampled, TraceLevel
    from webapp.env import load_config

    # as the server loads it
    loaded = load_model(model or None, settings=dataclasses.replace(load_config(), weights=weights))
    ids = loaded.tokenizer.encode(FILLER).ids

    def prefill(length: int) -> None:
        prompt = (ids * (length // len(ids) + 1))[:length]
        with torch.inference_mode():
            loaded.model(
                torch.tensor(prompt), loaded.model.plan([Chunk(0, 0, length)]), loaded.model.new_cache(1, length)
            )

    def decode_rate(level: TraceLevel) -> float:
        engine = Engine(loaded.model, loaded.stop_ids, loaded.tokenizer.token_bytes)
        prompt = loaded.chat_template.render(STORY).ids
        engine.scheduler.add(
            SequenceRequest("bench", prompt, SamplingParams(temperature=0.0, max_tokens=n + 1, ignore_eos=True), level)
        )
        times: list[float] = []
        while len(times) < n + 1:
            times += [e.t for output in engine.step() for e in output.events if isinstance(e, Sampled)]
        return n / (times[-1] - times[0])

    prefill_rates = {
        str(length): length / median_time(lambda length=length: prefill(length), repeats) for length in lengths
    }
    decode_rate(TraceLevel.OFF)  # warm-up
    decode: dict[str, list[float]] = {level: [] for level in LEVELS}
    for _ in range(repeats):  # levels interleaved, so a noisy moment does not land on one level alone
        for level in LEVELS:
            decode[level].append(decode_rate(TraceLevel(level)))
    return {
        "weights": loaded.weights_description,
        "load_seconds": loaded.load_seconds,
        "prefill": prefill_rates,
        "decode": {level: statistics.median(rates) for level, rates in decode.items()},
        "peak_rss_mib": peak_rss_mib(),
    }


def run_child(weights: str, args: argparse.Namespace, prompt_tokens: str | None = None) -> dict[str, Any] | None:
    """One format in a child process; `prompt_tokens` "" measures decoding only."""
    command = [
        sys.executable,
        __file__,
        "--child",
        weights,
        "--prompt-tokens",
        args.prompt_tokens if prompt_tokens is None else prompt_tokens,
        "--decode-tokens",
        str(args.decode_tokens),
        "--repeats",
        str(args.repeats),
        "--model",
        args.model,
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        print(f"{weights}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"  {weights:<6} {result['weights']}: decode off {result['decode']['off']:.1f} tok/s, peak RSS "
        f"{result['peak_rss_mib']:.0f} MiB",
        file=sys.stderr,
        flush=True,
    )
    return result


async def served(n: int, model: str) -> dict[str, Any]:
    """Start the server as a user would (default settings, the model under test alone), stream one request over SSE
    and one over the page's socket."""
    from benchmarks.bench_serving import roundtrip_server

    with roundtrip_server(Path(tempfile.mkdtemp(prefix="roundtrip-bench-")), [32], model) as target:
        return await _served_rates(target.url.removesuffix("/v1"), target.key, target.pid, n)


async def _served_rates(url: str, key: str, pid: int, n: int) -> dict[str, Any]:
    """One stream's decode rate, read three ways (interleaved, median of 3), and the server's peak RSS."""
    import httpx2 as httpx
    import websockets
    from websockets.typing import Origin

    from benchmarks.lean_stream import post_lines_blocking
    from benchmarks.llamacpp_reference import is_token

    body = {
        "model": "smollm2",
        "messages": STORY,
        "temperature": 0,
        "max_tokens": n + 1,
        "ignore_eos": True,
        "stream": True,
    }

    async def sse() -> float:
        """Read by the benchmarks' lean client: on two cores, a client that parses every chunk in Python takes CPU time
        from the server's own threads, and that cost belongs to the client, not to the serving path."""

        def read() -> list[float]:
            lines = post_lines_blocking(f"{url}/v1/chat/completions", body, {"Authorization": f"Bearer {key}"})
            return [time.perf_counter() for line in lines if is_token(line)]

        stamps = await asyncio.to_thread(read)
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    async def sse_httpx() -> float:
        """The same stream read by httpx line by line, as a Python application would."""
        stamps = []
        async with (
            httpx.AsyncClient(timeout=300) as client,
            client.stream(
                "POST", f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            ) as r,
        ):
            async for line in r.aiter_lines():
                if is_token(line.encode()):
                    stamps.append(time.perf_counter())
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    async def socket() -> float:
        stamps = []
        origin = Origin(url)
        async with websockets.connect(
            url.replace("http://", "ws://") + "/ws/pipeline/", origin=origin, max_size=None
        ) as ws:
            await ws.send(
                json.dumps(
                    {
                        "type": "chat",
                        "messages": STORY,
                        "level": "summary",
                        "params": {"temperature": 0, "max_tokens": n + 1},
                    }
                )
            )
            async for raw in ws:
                # a message holds one frame, or an array of the frames that were ready together (the page's pacing
                # sends at most one message per 150 ms once the answer streams: the rate is read first to last token)
                data = json.loads(raw)
                frames = data if isinstance(data, list) else [data]
                stamps += [
                    time.perf_counter() for f in frames if f["type"] == "trace" and f["event"]["event"] == "sampled"
                ]
                if any(f["type"] in ("done", "error") for f in frames):
                    break
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    await sse()  # warm-up
    sse_rates, httpx_rates, socket_rates = [], [], []
    for _ in range(3):  # interleaved, so a noisy moment does not land on one client alone
        sse_rates.append(await sse())
        httpx_rates.append(await sse_httpx())
        socket_rates.append(await socket())
    return {
        "sse": statistics.median(sse_rates),
        "sse_httpx": statistics.median(httpx_rates),
        "websocket_summary": statistics.median(socket_rates),
        "peak_rss_mib": peak_rss_mib(pid),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--weights",
        default="auto,int4,bf16,fp32,int8",
        help="weight formats (ROUNDTRIP_WEIGHTS values), comma-separated",
    )
    parser.add_argument("--prompt-tokens", default="27,128,512", help="prefill lengths, comma-separated")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-server", action="store_true", help="skip the served (SSE, WebSocket) measurements")
    parser.add_argument("--skip-llamacpp", action="store_true", help="leave out llama.cpp's column")
    parser.add_argument(
        "--model", default="", help="GGUF file or bundled model (gemma3-270m; default: SmolLM2-135M-Instruct)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = [int(x) for x in args.prompt_tokens.split(",") if x]
    if args.child:
        print(json.dumps(child(args.child, lengths, args.decode_tokens, args.repeats, args.model)))
        return

    import torch

    from benchmarks import llamacpp_reference
    from inference.loader import model_path

    path = model_path(args.model)
    results = {w: r for w in args.weights.split(",") if (r := run_child(w, args)) is not None}
    server = None if args.skip_server else asyncio.run(served(args.decode_tokens, args.model))
    if server is not None:  # the in-process rate again, right after serving: a machine's speed drifts over minutes
        server["in_process"] = run_child("auto" if "auto" in results else next(iter(results)), args, prompt_tokens="")
    theirs = None
    if not args.skip_llamacpp and llamacpp_reference.available():
        threads = torch.get_num_threads()
        theirs = llamacpp_reference.llama_bench(path, lengths, args.decode_tokens, threads, args.repeats)
        if theirs is not None and server is not None:
            theirs["served"] = llamacpp_reference.served_decode_rate(
                path,
                [{"role": m["role"], "content": str(m["content"])} for m in STORY],
                args.decode_tokens,
                threads,
                args.repeats,
            )
    elif not args.skip_llamacpp:
        print("llama.cpp not found: run ../shared/tools/llamacpp-reference for its column", file=sys.stderr)
    report(results, server, theirs, lengths, args.decode_tokens, path)


def report(
    results: dict[str, dict[str, Any]],
    server: dict[str, Any] | None,
    theirs: dict[str, Any] | None,
    lengths: list[int],
    n: int,
    path: str,
) -> None:
    import torch

    ref = f"{theirs['version']} (llama-bench pp/tg, same threads)" if theirs else "llama.cpp: not built"
    print(
        f"\nmodel {path}\ntorch {torch.__version__}, {torch.get_num_threads()} threads; {ref}; tokens/s, higher is "
        "better"
    )
    names = list(results)
    print(f"\n{'':<30}" + "".join(f"{w:>12}" for w in names) + f"{'llama.cpp':>12}")
    print(f"{'format':<30}" + "".join(f"{results[w]['weights'].split(',')[0]:>12}" for w in names))

    def row(label: str, values: list[float | None], other: float | None = None) -> None:
        cells = "".join(f"{v:>12.1f}" if v is not None else f"{'-':>12}" for v in values)
        print(f"{label:<30}{cells}" + (f"{other:>12.1f}" if other else f"{'-':>12}"))

    for length in lengths:
        row(
            f"prefill {length} tokens",
            [results[w]["prefill"][str(length)] for w in names],
            theirs["prefill"][str(length)] if theirs else None,
        )
    for level in LEVELS:
        row(
            f"decode {n}, trace {level}",
            [results[w]["decode"][level] for w in names],
            theirs["decode"] if theirs and level == "off" else None,  # llama-bench tg: generation, no trace
        )
    row("peak RSS, MiB (lower is better)", [results[w]["peak_rss_mib"] for w in names])
    print()
    for w in names:
        d = results[w]["decode"]
        ratio = f", decode off / llama-bench tg {d['off'] / theirs['decode']:.2f}x" if theirs else ""
        print(
            f"{w} ({results[w]['weights']}): trace cost summary {100 * (d['off'] / d['summary'] - 1):+.1f}%, "
            f"full {d['off'] / d['full']:.2f}x the time of off{ratio}"
        )
    if server is not None:
        again = server.get("in_process")
        base = again["decode"] if again else results.get("auto", next(iter(results.values())))["decode"]
        print(
            f"\nin-process again right after serving: decode off {base['off']:.1f}, summary {base['summary']:.1f} tok/s"
        )
        print(
            f"served (default settings): SSE {server['sse']:.1f} tok/s ({server['sse'] / base['off']:.0%} of "
            "in-process off), "
            f"WebSocket at summary {server['websocket_summary']:.1f} tok/s "
            f"({server['websocket_summary'] / base['summary']:.0%} of in-process summary), "
            f"server peak RSS {server['peak_rss_mib']:.0f} MiB\n  (SSE read by httpx line by line: "
            f"{server['sse_httpx']:.1f} tok/s, "
            f"{server['sse_httpx'] / base['off']:.0%}: the client's own parsing shares the two cores)"
        )
        if theirs is not None and theirs.get("served"):
            print(
                f"llama-server streaming one answer, read by the same client: {theirs['served']:.1f} tok/s; "
                f"Roundtrip's SSE / llama-server's: {server['sse'] / theirs['served']:.2f}x"
            )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
