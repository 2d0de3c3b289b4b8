"""How the tests load models in-process: on the CPU, in float32 unless a test asks for another format.

Models in the tests run float32 weights: the tests compare them with float64 re-computations and demand batched greedy
text equal to unbatched, which bfloat16 activations (every other format) do not promise. Converted weights are not
cached unless a test asks (`use_cache=True` with its own `cache_dir`); our CPU kernels are built into the user's cache.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from inference.load_config import LoadConfig

CPU = LoadConfig(device="cpu", weights="fp32", use_cache=False)


def cpu(**changes: Any) -> LoadConfig:
    """`CPU` with `changes` (e.g. `weights="int4"`, `kv_cache="float16"`, `use_cache=True, cache_dir=tmp_path`)."""
    return dataclasses.replace(CPU, **changes)
