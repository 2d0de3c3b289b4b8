"""Single-stream inference speed: prefill and decode tokens/s, beside llama.cpp on the same file.

    python benchmarks/bench_inference.py [--model PATH] [--llamacpp-python PATH]

Our numbers come from the engine itself (prefill of a whole prompt; greedy decode with
sampling, stop tokens disabled so every run decodes the same count), at each trace level.
llama.cpp's come from `llama_cpp` in a subprocess (see llamacpp_side.py): by default the
virtualenv built by ../shared/tools/llamacpp-reference, or this Python if it has llama_cpp.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inference.batch import Chunk  # noqa: E402
from inference.loader import LoadedModel, load_model  # noqa: E402
from inference.params import SamplingParams  # noqa: E402
from inference.scheduler import Scheduler  # noqa: E402
from inference.sequence import SequenceRequest  # noqa: E402
from inference.trace import Sampled, TraceLevel  # noqa: E402

DEFAULT_LLAMACPP_PYTHON = Path.home() / ".cache" / "llamacpp-reference" / "venv" / "bin" / "python"
FILLER = (
    "The history of the printing press begins in the fifteenth century, when movable type changed how "
    "books were made, sold and read across Europe. "
)


def prompt_ids(loaded: LoadedModel, length: int) -> list[int]:
    """Real text, tokenized and cut to exactly `length` tokens."""
    ids = loaded.tokenizer.encode(FILLER).ids
    return (ids * (length // len(ids) + 1))[:length]


def median_time(fn: Any, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def prefill(loaded: LoadedModel, ids: list[int]) -> None:
    """The whole prompt in one forward, into a fresh cache."""
    model = loaded.model
    plan = model.plan([Chunk(0, 0, len(ids))])
    with torch.inference_mode():
        model(torch.tensor(ids, device=loaded.device), plan, model.new_cache(1, len(ids)))


def decode_times(loaded: LoadedModel, prompt: list[int], n: int, level: TraceLevel) -> list[float]:
    """One request alone in the scheduler, greedy, ending tokens ignored: when each of its n + 1 tokens was sampled."""
    scheduler = Scheduler(loaded.model, loaded.stop_ids, loaded.tokenizer.token_bytes)
    scheduler.add(SequenceRequest("bench", prompt, SamplingParams(temperature=0.0, max_tokens=n + 1, ignore_eos=True), level))
    times: list[float] = []
    while len(times) < n + 1:
        times += [e.t for output in scheduler.step() for e in output.events if isinstance(e, Sampled)]
    return times


def bench_ours(loaded: LoadedModel, prompts: dict[str, list[int]], decode_prompt: list[int], n: int, repeats: int) -> dict[str, Any]:
    rates = {name: len(ids) / median_time(lambda ids=ids: prefill(loaded, ids), repeats) for name, ids in prompts.items()}
    decode = {}
    for level in TraceLevel:
        runs = [decode_times(loaded, decode_prompt, n, level) for _ in range(repeats)]
        decode[level.value] = statistics.median(n / (times[-1] - times[0]) for times in runs)
    return {"prefill": rates, "decode": decode}


def bench_llamacpp(python: str, model: str, prompts: dict[str, list[int]], decode_prompt: list[int], n: int, repeats: int) -> dict[str, Any] | None:
    job = {"model": model, "prompts": prompts, "decode_prompt": decode_prompt, "decode_tokens": n, "repeats": repeats, "threads": torch.get_num_threads()}
    try:
        done = subprocess.run([python, str(Path(__file__).with_name("llamacpp_side.py"))], input=json.dumps(job), capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"llama.cpp side failed to run: {exc}", file=sys.stderr)
        return None
    if done.returncode != 0:
        print(f"llama.cpp side failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def find_llamacpp_python(requested: str | None) -> str | None:
    if requested == "none":
        return None
    if requested:
        return requested
    if DEFAULT_LLAMACPP_PYTHON.exists():
        return str(DEFAULT_LLAMACPP_PYTHON)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return None
    return sys.executable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--prompt-tokens", default="27,128,512", help="prefill lengths, comma-separated")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--llamacpp-python", help="a Python with llama_cpp ('none' to skip)")
    args = parser.parse_args()

    loaded = load_model(args.model)
    lengths = [int(x) for x in args.prompt_tokens.split(",")]
    prompts = {str(n): prompt_ids(loaded, n) for n in lengths}
    decode_prompt = loaded.chat_template.render(
        [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Tell me a long story about a dragon."}]
    ).ids
    ours = bench_ours(loaded, prompts, decode_prompt, args.decode_tokens, args.repeats)
    python = find_llamacpp_python(args.llamacpp_python)
    theirs = bench_llamacpp(python, loaded.path, prompts, decode_prompt, args.decode_tokens, args.repeats) if python else None

    print(f"model: {loaded.path}")
    print(f"ours: torch {torch.__version__} on {loaded.device} ({str(loaded.dtype).removeprefix('torch.')}), {torch.get_num_threads()} threads; "
          f"load {loaded.load_seconds:.2f}s{' (cache)' if loaded.from_cache else ''}; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    ref = f"llama.cpp {theirs['version']}" if theirs else "llama.cpp (not installed)"
    print(f"\n{'tokens/s':<34}{'roundtrip':>12}{ref:>28}{'ratio':>8}")

    def row(label: str, mine: float, other: float | None) -> None:
        other_s = f"{other:>28.1f}" if other else f"{'-':>28}"
        ratio = f"{mine / other:>8.2f}" if other else f"{'':>8}"
        print(f"{label:<34}{mine:>12.1f}{other_s}{ratio}")

    for n in lengths:
        row(f"prefill, {n}-token prompt", ours["prefill"][str(n)], theirs["prefill"][str(n)] if theirs else None)
    for level, rate in ours["decode"].items():
        row(f"decode {args.decode_tokens} tokens, trace {level}", rate, theirs["decode"] if theirs and level == "off" else None)
    off = ours["decode"]["off"]
    print(f"\ntrace cost on decode: summary {100 * (off / ours['decode']['summary'] - 1):+.1f}%, full {100 * (off / ours['decode']['full'] - 1):+.1f}% time per token")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
