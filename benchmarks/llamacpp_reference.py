"""llama.cpp at its best on the same file, for the benchmarks' reference column (built by
../shared/tools/llamacpp-reference; a reference, never a dependency):

- `llama_bench`: its own benchmark tool's prompt processing (pp) and token generation (tg) rates, in C++ with no
  Python in the loop: what the engine does alone;
- `served_decode_rate`: llama-server streaming one answer over SSE, read by the same lean client that reads
  Roundtrip's, from the first token to the last: what a client of the server gets.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lean_stream import post_lines_blocking

LLAMACPP = Path.home() / ".cache" / "llamacpp-reference"


def available() -> bool:
    return (LLAMACPP / "bin" / "llama-bench").exists() and (LLAMACPP / "bin" / "llama-server").exists()


def llama_bench(model: str, lengths: list[int], n: int, threads: int, repeats: int) -> dict[str, Any] | None:
    """{"version", "prefill": {length: tok/s}, "decode": tok/s} from `llama-bench -p <lengths> -n <n>`; None if it
    fails."""
    command = [
        str(LLAMACPP / "bin" / "llama-bench"),
        "-m",
        model,
        "-t",
        str(threads),
        "-r",
        str(repeats),
        "-o",
        "json",
        "-p",
        ",".join(str(length) for length in lengths),
        "-n",
        str(n),
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
        env={"LD_LIBRARY_PATH": str(LLAMACPP / "lib")},
    )
    if done.returncode != 0:
        print(f"llama-bench failed:\n{done.stderr[-2000:]}")
        return None
    tests = json.loads(done.stdout)
    return {
        "version": f"llama.cpp {tests[0]['build_commit']}",
        "prefill": {str(t["n_prompt"]): t["avg_ts"] for t in tests if t["n_gen"] == 0},
        "decode": next(t["avg_ts"] for t in tests if t["n_prompt"] == 0),
    }


def served_decode_rate(model: str, messages: list[dict[str, str]], n: int, threads: int, repeats: int) -> float | None:
    """llama-server's one-stream decode rate over SSE (median of `repeats`, after a warm-up), read as Roundtrip's is."""
    from benchmarks.bench_serving import llama_server  # starts it as the serving benchmark does

    body = {
        "model": "default",
        "messages": messages,
        "temperature": 0,
        "max_tokens": n + 1,
        "ignore_eos": True,
        "stream": True,
    }
    with tempfile.TemporaryDirectory(prefix="llamacpp-") as tmp, llama_server(Path(tmp), [1], model, threads) as target:
        if target is None:
            return None
        rates = [_stream_rate(f"{target.url}/chat/completions", body) for _ in range(repeats + 1)][1:]
    return statistics.median(rates)


def _stream_rate(url: str, body: dict[str, Any]) -> float:
    stamps = [time.perf_counter() for line in post_lines_blocking(url, body, {}) if is_token(line)]
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def is_token(line: bytes) -> bool:
    """An SSE chunk that carries output text (Roundtrip's and llama-server's alike)."""
    return line.startswith(b"data: {") and b'"content"' in line and b'"content":""' not in line.replace(b" ", b"")
