"""The llama.cpp half of the inference benchmark, run with a Python that has `llama_cpp` installed.

Standard library and llama_cpp only, so it can run in llama.cpp's own virtualenv.
Reads a JSON job on stdin, prints a JSON result on stdout.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any


def main() -> None:
    import llama_cpp

    job: dict[str, Any] = json.load(sys.stdin)
    prompts: dict[str, list[int]] = job["prompts"]
    n_decode: int = job["decode_tokens"]
    longest = max(len(ids) for ids in prompts.values())
    llm = llama_cpp.Llama(
        model_path=job["model"], n_ctx=longest + n_decode + 16, n_batch=512, n_threads=job["threads"], verbose=False
    )
    prefill: dict[str, float] = {}
    for name, ids in prompts.items():
        times = []
        for _ in range(job["repeats"] + 1):  # the first run warms up
            llm.reset()
            started = time.perf_counter()
            llm.eval(ids)
            times.append(time.perf_counter() - started)
        prefill[name] = len(ids) / statistics.median(times[1:])
    decode = []
    for _ in range(job["repeats"]):
        llm.reset()
        llm.eval(job["decode_prompt"])
        started = time.perf_counter()
        for _ in range(n_decode):
            token = llm.sample(temp=0.0)
            llm.eval([token])
        decode.append(n_decode / (time.perf_counter() - started))
    json.dump({"version": llama_cpp.__version__, "prefill": prefill, "decode": statistics.median(decode)}, sys.stdout)


if __name__ == "__main__":
    main()
