"""Command-line check: `python -m inference "What's the capital of India?"`.

Streams the answer as it is generated, then prints time to first token, mean
inter-token latency and decode tokens/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from inference.chat_template import Message
from inference.errors import InferenceError
from inference.load_config import LoadConfig
from inference.loader import load_model
from inference.params import SamplingParams
from inference.pipeline import ChatPipeline
from inference.progress import terminal_progress
from inference.trace import Finished, TextDelta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference", description=__doc__.splitlines()[0])
    parser.add_argument("prompt")
    parser.add_argument("--system", default="You are a helpful assistant.")
    parser.add_argument("--model", help="path to a LLaMA-family GGUF file (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int)
    defaults = LoadConfig()
    for option in dataclasses.fields(LoadConfig):  # how the model loads: the server's ROUNDTRIP_* settings, as options
        if option.name != "use_cache":
            default = getattr(defaults, option.name)
            kind: Callable[[str], Any] = type(default) if default is not None else str
            parser.add_argument(
                f"--{option.name.replace('_', '-')}",
                default=default,
                type=kind,
                help=f"as ROUNDTRIP_{option.name.upper()} (default: {default or 'cuda when present, else cpu'})",
            )
    args = parser.parse_args(argv)
    settings = LoadConfig(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(LoadConfig) if f.name != "use_cache"}
    )
    try:
        loaded = load_model(args.model, settings, progress=terminal_progress())
        print(
            f"[{loaded.model_id} on {loaded.device} ({loaded.dtype}), loaded in {loaded.load_seconds:.2f}s"
            f"{' from cache' if loaded.from_cache else ''}]",
            file=sys.stderr,
        )
        pipeline = ChatPipeline(loaded)
        messages: list[Message] = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": args.prompt})
        params = SamplingParams(
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens, seed=args.seed
        )
        request = pipeline.prepare(messages, params)
        for event in pipeline.stream(request):
            if isinstance(event, TextDelta):
                print(event.text, end="", flush=True)
            elif isinstance(event, Finished):
                print()
                _print_summary(event)
    except InferenceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _print_summary(done: Finished) -> None:
    t = done.timings
    itl = f"{t.mean_itl * 1000:.1f} ms" if t.mean_itl is not None else "n/a"
    rate = f"{t.decode_tokens_per_s:.1f}" if t.decode_tokens_per_s is not None else "n/a"
    print(
        f"[{done.prompt_tokens} prompt + {done.completion_tokens} completion tokens, finish: {done.finish_reason}, "
        f"seed {done.seed}]\n"
        f"TTFT {t.ttft * 1000:.0f} ms | mean inter-token latency {itl} | {rate} tokens/s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    sys.exit(main())
