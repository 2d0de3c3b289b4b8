"""A compiled int4 matrix multiply for many rows at once, for CPUs with AMX.

torch's eager int4 kernel (`_weight_int4pack_mm_for_cpu`) is quick for a decode step's few
rows but slow for a prompt's hundreds (8x slower than bf16 at 128 rows here): it decodes
every weight again for every row. Inductor's C++ GEMM template decodes a tile of weights once
and multiplies it on the AMX units — as fast as bf16 while reading a quarter of the bytes.
`inference.int4_gemm_build` compiles it ahead of time, once per weight shape, in a child
process, reading the eager kernel's own packed weights (one copy serves both kernels); the
engine loads the shared libraries directly (no inductor import: that would cost ~120 MB of
memory).

A failed build or a CPU without AMX means no kernels, and the eager kernel serves alone; a
projection checks its kernel against the eager one on its own weights before using it
(`inference.weights.Int4.attach`).
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

log = logging.getLogger("roundtrip.inference")

BLOCK_N = 64  # outputs per block of the eager kernel's packed layout, which the compiled one reads
LAYOUT = "eager-packed-1"  # what the libraries read; part of their cache key
Shape = tuple[int, int]  # (out_features, in_features)


def supported(n: int, k: int) -> bool:
    return n % BLOCK_N == 0 and k % 32 == 0


class Kernel:
    """One compiled shape: y [M, N] = x [M, K] @ W.T for weights packed for the eager kernel; M of at least 2."""

    def __init__(self, library: Path) -> None:
        self.library = library
        self._runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(library), 1)

    def __call__(self, x: Tensor, packed: Tensor, scales_and_zeros: Tensor) -> Tensor:
        out: Tensor = self._runner.run([x.contiguous(), packed, scales_and_zeros])[0]
        return out


def library_dir(cache_dir: Path) -> Path:
    """Libraries belong to a torch build, a CPU (the template tunes for it) and the weight layout they read."""
    key = f"{torch.__version__}|{_cpu_model()}|{torch.get_num_threads()}|{LAYOUT}"
    return cache_dir / "kernels" / hashlib.sha256(key.encode()).hexdigest()[:16]


def load(
    shapes: Sequence[Shape], cache_dir: Path, report: Callable[[str], None] = lambda note: None
) -> dict[Shape, Kernel] | None:
    """Kernels for `shapes`, building the missing ones (minutes, once); None where they cannot be used."""
    if not torch._C._cpu._init_amx():
        return None
    shapes = sorted({s for s in shapes if supported(*s)})
    if not shapes:
        return None
    folder = library_dir(cache_dir)
    missing = [s for s in shapes if not (folder / f"int4-{s[0]}x{s[1]}.so").exists()]
    if missing:
        report(
            f"building the int4 prompt kernel for {len(missing)} weight shapes (first start only, about "
            f"{20 * len(missing)} s)"
        )
        command = [sys.executable, "-m", "inference.int4_gemm_build", str(folder)] + [
            str(d) for s in missing for d in s
        ]
        root = Path(__file__).resolve().parent.parent
        # `-m` finds the package in cwd
        done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log.warning("int4 GEMM build failed; prompts use the eager int4 kernel:\n%s", done.stderr[-2000:])
            return None
    kernels = {}
    for n, k in shapes:
        try:
            kernels[(n, k)] = Kernel(folder / f"int4-{n}x{k}.so")
        except RuntimeError as exc:
            log.warning("int4 GEMM %sx%s does not load (%s); prompts use the eager int4 kernel", n, k, exc)
            return None
    return kernels


def agrees(kernel: Callable[[Tensor, Tensor, Tensor], Tensor], packed: Tensor, scales_and_zeros: Tensor) -> bool:
    """A kernel against torch's eager one on the same weights: equal up to bf16 rounding of the outputs."""
    x = torch.randn(24, packed.shape[1] * 2, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    expected = torch._weight_int4pack_mm_for_cpu(x, packed, 32, scales_and_zeros).float()
    got = kernel(x, packed, scales_and_zeros).float()
    return bool((got - expected).abs().max() <= 0.02 * expected.abs().max())


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return torch.backends.cpu.get_cpu_capability()
