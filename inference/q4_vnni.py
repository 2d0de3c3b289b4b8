"""int4 weights times int8 activations on AVX512-VNNI: a matrix multiply whose cost barely grows from 1 to 16 rows.

A batched decode step multiplies every weight by a handful of rows. torch's eager int4 kernel decodes
each weight again for every block of 4 rows, so 8 rows cost twice one row; inductor's AMX GEMM costs
2.5 times one row from 2 rows up. `q4_vnni.cpp` unpacks each group of weights once and multiplies it
into up to 8 rows with VPDPBUSD (4-bit codes times activations quantized to int8 per group of 32, as
llama.cpp does), so a step of 8 sequences reads the weights once for all of them. A row's result does
not depend on the other rows of the batch: a request decoded in a batch gives exactly what it gives alone.

The library is compiled once per torch build and CPU, in a child process (`python -m
inference.q4_vnni_build PATH`), cached beside the weights, and loaded as torch operators:
`torch.ops.roundtrip.q4_mm`, and `torch.ops.roundtrip.rms_norm` (`rms_norm.cpp`: one pass per row
where torch's CPU RMSNorm runs six ops; the model uses it whenever the library is loaded). A CPU
without AVX512-VNNI, a failed build, or `ROUNDTRIP_Q4_VNNI=off` leaves the library out, and int4
runs on torch's own kernels.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

log = logging.getLogger("roundtrip.inference")

SOURCES = (Path(__file__).with_name("q4_vnni.cpp"), Path(__file__).with_name("rms_norm.cpp"))
FLAGS = ("-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma")
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma")
BLOCK_N = 16  # outputs per block of the packed layout
GROUP = 32  # inputs per quantization group (the weights' and the activations')
BLOCK_BYTES = 4 * 64 + 2 * 32  # one group of one block: 32 x 16 codes in nibbles, 16 fp16 scales, 16 fp16 minimums


def supported(n: int, k: int) -> bool:
    return n % BLOCK_N == 0 and k % GROUP == 0


def cpu_supports() -> bool:
    """Whether this CPU has every instruction the kernel is compiled for."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return all(flag in flags for flag in CPU_FLAGS)


def library_path(cache_dir: Path) -> Path:
    """A library belongs to a torch build (its C++ ABI) and to this source and these flags."""
    sources = hashlib.sha256(b"".join(source.read_bytes() for source in SOURCES)).hexdigest()
    key = f"{torch.__version__}|{' '.join(FLAGS)}|{sources}"
    return cache_dir / "kernels" / f"q4-vnni-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


_loaded = False  # set once `load` has loaded the library into this process


def is_loaded() -> bool:
    return _loaded


def load(cache_dir: Path, report: Callable[[str], None] = lambda note: None) -> bool:
    """Make `torch.ops.roundtrip.q4_mm` available, building it the first time (about 20 s); whether it is."""
    if os.environ.get("ROUNDTRIP_Q4_VNNI", "auto") == "off" or not cpu_supports():
        return False
    if is_loaded():
        return True
    library = library_path(cache_dir)
    if not library.exists():
        report("building the int4 x int8 VNNI kernel (first start only, about 20 s)")
        root = SOURCES[0].parent.parent
        done = subprocess.run([sys.executable, "-m", "inference.q4_vnni_build", str(library)], cwd=root, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(root)})
        if done.returncode != 0:
            log.warning("the int4 VNNI kernel did not build; int4 uses torch's kernels:\n%s", done.stderr[-2000:])
            return False
    try:
        torch.ops.load_library(str(library))
    except (OSError, RuntimeError) as exc:
        log.warning("the int4 VNNI kernel does not load (%s); int4 uses torch's kernels", exc)
        return False
    global _loaded
    _loaded = True
    return True


def pack(codes: Tensor, scales: Tensor, minimums: Tensor) -> Tensor:
    """Q4_1 blocks (codes uint8 [N, K] in 0..15, scales and minimums [N, K/32]) in the kernel's layout:
    uint8 [N/16, K/32, 320], one contiguous stream of codes, scales and minimums per block of 16 outputs."""
    n, k = codes.shape
    nb, groups = n // BLOCK_N, k // GROUP
    quads = codes.view(nb, BLOCK_N, groups, 4, 2, 4)  # [N/16, 16, K/32, quad, half, 4]: input 8 quad + 4 half + j
    nibbles = (quads[..., 0, :] | (quads[..., 1, :] << 4)).permute(0, 2, 3, 1, 4).reshape(nb, groups, 256)  # [N/16, K/32, quad*16*4]

    def halves(values: Tensor) -> Tensor:
        return values.view(nb, BLOCK_N, groups).permute(0, 2, 1).to(torch.float16).contiguous().view(torch.uint8)  # [N/16, K/32, 32]

    return torch.cat([nibbles, halves(scales), halves(minimums)], dim=-1).contiguous()


def multiply(x: Tensor, packed: Tensor, out_features: int) -> Tensor:
    """float32 y [M, N] = x [M, K] @ W.T."""
    y: Tensor = torch.ops.roundtrip.q4_mm(x, packed, out_features)
    return y


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / rms(x) * weight over the last dimension, float32 in and out."""
    y: Tensor = torch.ops.roundtrip.rms_norm(x, weight, eps)
    return y
