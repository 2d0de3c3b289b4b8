"""Our own CPU kernels (`inference/kernels/*.cpp`), for the places where torch's leave most of a batched decode step.

- `q4_mm` (`q4_mm.cpp`): int4 weights times int8 activations (and `q8_mm`, the same for byte codes: a GGUF's 5-, 6- and
  8-bit blocks). torch's eager int4 kernel decodes each
  weight again for every block of 4 rows, so a step of 8 sequences costs twice one; inductor's AMX GEMM
  costs 2.5 times one row from 2 rows up. This one unpacks each group of weights once and multiplies it into
  a tile of rows (8 with AVX512-VNNI's VPDPBUSD, 4 with AVX2's VPMADDUBSW). Activations are rounded to int8 per
  group of 32, as llama.cpp does (`ROUNDTRIP_Q4_ACTIVATIONS=int8x2`: two parts, float32's results for
  twice the multiplies; see `activation_parts`). A row's result does not depend on the other rows of the batch, so
  a request decoded in a batch gives exactly what it gives alone.
- `rms_norm` (`rms_norm.cpp`): one pass per row, where torch's CPU RMSNorm runs six ops.
- `decode_attention` (`decode_attention.cpp`): each decode row against exactly its own sequence's
  keys, where torch's SDPA pads every row to the longest and is tuned for long query blocks.
- `row_summary` and `near_best` (`logit_rows.cpp`): each row of logits' log-partition and best token, and the tokens
  near the best, in one or two passes, where torch makes several over a fresh copy of the 49k-wide rows.

The library is compiled once per torch build, source and instruction set, in a child process (`python -m
inference.cpu_kernels_build PATH ISA`, about 30 s), cached beside the weights, and loaded as torch operators. It is
built for the best instruction set this CPU has (`ISAS`: AVX512-VNNI with AMX, AVX512-VNNI, else AVX2; `simd.h` writes
each kernel once for the vector units). With AMX, `q4_mm` also has a tile path, bit for bit the same, used from a batch
size measured at load (`choose_amx_rows`). A CPU with neither, a failed build, or `ROUNDTRIP_CPU_KERNELS=off` leaves it
out, and the model runs on
torch's own kernels; whether `q4_mm` replaces torch's int4 kernels is measured (`inference.weight_choice`).
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

log = logging.getLogger("roundtrip.inference")

SOURCES = tuple(
    Path(__file__).with_name("kernels") / name
    for name in ("q4_mm.cpp", "rms_norm.cpp", "decode_attention.cpp", "logit_rows.cpp")
)
HEADERS = (Path(__file__).with_name("kernels") / "simd.h",)
BLOCK_N = 16  # outputs per block of q4_mm's packed layout
GROUP = 32  # inputs per quantization group (the weights' and the activations')
ACTIVATION_SETTINGS = {"int8": 1, "int8x2": 2}  # int8 parts per activation in q4_mm


@dataclass(frozen=True)
class Isa:
    """An instruction set the kernels compile for: the compiler's flags and the CPU flags (`/proc/cpuinfo`) it needs."""

    name: str
    compiler_flags: tuple[str, ...]
    cpu_flags: tuple[str, ...]


_VNNI_FLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma")
_VNNI_CPU = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma")
ISAS = (  # best first
    Isa("avx512-amx", (*_VNNI_FLAGS, "-mamx-tile", "-mamx-int8"), (*_VNNI_CPU, "amx_tile", "amx_int8")),
    Isa("avx512-vnni", _VNNI_FLAGS, _VNNI_CPU),
    Isa("avx2", ("-mavx2", "-mf16c", "-mfma"), ("avx2", "f16c", "fma")),
)
# products and sums rounded as written: see roped_decode_attention
COMMON_FLAGS = (
    "-O3",
    "-fopenmp",
    "-ffp-contract=off",
)

_loaded: Isa | None = None  # set once `load` has loaded the library into this process
_activation_parts = 1  # see `use_activations`
AMX_ROWS = (1, 2, 3, 4, 6, 8, 12, 16)  # batch sizes at which q4_mm's two paths are timed against each other


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))


def isa(setting: str = "auto") -> Isa | None:
    """The instruction set to build for, by `LoadConfig.cpu_kernels` (`auto`: the best this CPU has; `off`; or an
    ISA's name, to try a lesser one on a CPU that has more); None for none. A setting outside those is an error."""
    names = {candidate.name: candidate for candidate in ISAS}
    if setting not in ("auto", "off", *names):
        raise ValueError(f"ROUNDTRIP_CPU_KERNELS={setting!r}: use auto, off, or one of {', '.join(names)}")
    flags = _cpu_flags()
    wanted = ISAS if setting == "auto" else (names[setting],) if setting in names else ()
    return next((candidate for candidate in wanted if set(candidate.cpu_flags) <= flags), None)


def cpu_supports() -> bool:
    """Whether this CPU has an instruction set the kernels are compiled for."""
    return isa("auto") is not None


def library_path(cache_dir: Path, target: Isa) -> Path:
    """A library belongs to a torch build (its C++ ABI), to these sources and to an instruction set."""
    sources = hashlib.sha256(b"".join(source.read_bytes() for source in (*SOURCES, *HEADERS))).hexdigest()
    key = f"{torch.__version__}|{' '.join(COMMON_FLAGS + target.compiler_flags)}|{sources}"
    return cache_dir / "kernels" / f"roundtrip-cpu-{target.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def is_loaded() -> bool:
    return _loaded is not None


def loaded_isa() -> str | None:
    """The name of the instruction set of the loaded library, or None."""
    return _loaded.name if _loaded is not None else None


def describe() -> str:
    """The loaded kernels, for the weights' description: the instruction set, and from which batch size q4_mm uses
    AMX."""
    if _loaded is None:
        return "not loaded"
    rows = amx_from_rows()
    return _loaded.name + (f", AMX tiles from {rows} rows" if rows else "")


def amx_from_rows() -> int:
    """From how many rows (of int8 codes) q4_mm multiplies on the AMX tile unit; 0: never."""
    return int(torch.ops.roundtrip.q4_mm_amx_from(-1)) if _loaded is not None and "amx" in _loaded.name else 0


def choose_amx_rows(weights: list[tuple[Tensor, int, int]], rows: tuple[int, ...] = AMX_ROWS, rounds: int = 3) -> int:
    """Time q4_mm's vector path against its AMX path over a model's own weights (`weights`: packed, out_features,
    in_features) at each batch size, best of `rounds` taken in turns, and use AMX from the smallest batch size at which
    it is faster there and at every larger one measured.

    Both paths give the same bits, so this decides speed only. It has to be the model's weights, in the order a step
    reads them: on the AMX machine here, with a matrix hot in cache the vector path wins at every batch size, while a
    step that streams all the weights from memory is 20% faster on AMX at 8 rows (7.6 -> 6.0 ms at 2 threads).
    About half a second for the default model."""
    if not weights or torch.ops.roundtrip.q4_mm_amx_from(1) == 0:
        torch.ops.roundtrip.q4_mm_amx_from(0)
        return 0
    generator = torch.Generator().manual_seed(0)
    inputs = {(r, k): torch.randn(r, k, generator=generator) for r in rows for k in {k for _, _, k in weights}}
    best = {(r, amx): float("inf") for r in rows for amx in (False, True)}
    for _ in range(rounds):
        for r in rows:
            for amx in (False, True):
                torch.ops.roundtrip.q4_mm_amx_from(1 if amx else 0)
                started = time.perf_counter()
                for packed, n, k in weights:
                    q4_mm(inputs[r, k], packed, n)
                best[r, amx] = min(best[r, amx], time.perf_counter() - started)
    wins = {r for r in rows if best[r, True] < best[r, False]}
    chosen = next((r for r in rows if all(later in wins for later in rows if later >= r)), 0)
    log.info(
        "q4_mm on AMX from %s rows (ms, vector / AMX: %s)",
        chosen or "no",
        ", ".join(f"{r}: {best[r, False] * 1e3:.2f} / {best[r, True] * 1e3:.2f}" for r in rows),
    )
    return int(torch.ops.roundtrip.q4_mm_amx_from(chosen))


def load(cache_dir: Path, setting: str = "auto", report: Callable[[str], None] = lambda note: None) -> bool:
    """Load the kernels for `setting` (see `isa`), building them the first time; whether they are loaded."""
    global _loaded
    target = isa(setting)
    if target is None:
        return False
    if _loaded is not None:
        return True
    library = library_path(cache_dir, target)
    if not library.exists():
        report(f"building Roundtrip's CPU kernels for {target.name} (first start only, about 30 s)")
        root = SOURCES[0].parent.parent.parent
        # The builder runs `ninja` from PATH: the shell puts this interpreter's folder first, where requirements.txt
        # installs it (a virtualenv's folder is not on PATH unless activated).
        build = [sys.executable, "-m", "inference.cpu_kernels_build", str(library), target.name]
        done = subprocess.run(
            ["sh", "-c", 'PATH="$0:$PATH" exec "$@"', str(Path(sys.executable).parent), *build],
            cwd=root,  # `-m` finds the package here
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            log.warning("Roundtrip's CPU kernels did not build; the model runs on torch's:\n%s", done.stderr[-2000:])
            return False
    try:
        torch.ops.load_library(str(library))
    except (OSError, RuntimeError) as exc:
        log.warning("Roundtrip's CPU kernels do not load (%s); the model runs on torch's", exc)
        return False
    _loaded = target
    return True


def q4_supported(n: int, k: int) -> bool:
    return n % BLOCK_N == 0 and k % GROUP == 0


def _per_block(values: Tensor, dtype: torch.dtype) -> Tensor:
    """One value per output and group of 32 inputs [N, K/32] in the packed layouts' order: [N/16, K/32, 16 values]
    in `dtype`, as bytes."""
    n, groups = values.shape
    return values.view(n // BLOCK_N, BLOCK_N, groups).permute(0, 2, 1).to(dtype).contiguous().view(torch.uint8)


def _byte_stream(codes: Tensor) -> Tensor:
    """Byte codes [N, K] as VPDPBUSD reads them: [N/16, K/32, 512], for input quad j, output n, byte b:
    code[4 j + b]."""
    n, k = codes.shape
    quads = codes.view(torch.uint8).view(n // BLOCK_N, BLOCK_N, k // GROUP, 8, 4)  # [N/16, 16, K/32, quad, 4]
    return quads.permute(0, 2, 3, 1, 4).reshape(n // BLOCK_N, k // GROUP, 512)


def q4_pack(codes: Tensor, scales: Tensor, minimums: Tensor) -> Tensor:
    """Q4_1 blocks (codes uint8 [N, K] in 0..15, scales and minimums [N, K/32]) in q4_mm's layout:
    uint8 [N/16, K/32, 320], one contiguous stream of codes, scales and minimums per block of 16 outputs."""
    n, k = codes.shape
    nb, groups = n // BLOCK_N, k // GROUP
    quads = codes.view(nb, BLOCK_N, groups, 4, 2, 4)  # [N/16, 16, K/32, quad, half, 4]: input 8 quad + 4 half + j
    # [N/16, K/32, quad*16*4]
    nibbles = (quads[..., 0, :] | (quads[..., 1, :] << 4)).permute(0, 2, 3, 1, 4).reshape(nb, groups, 256)
    halves = [_per_block(v, torch.float16) for v in (scales, minimums)]
    return torch.cat([nibbles, *halves], dim=-1).contiguous()


def q8_fast() -> bool:
    """Whether q8_mm and q6_mm run here: the kernels are loaded (every instruction set has their exact paths:
    AVX512-VNNI's VPDPBUSD on the bytes; with AVX2, VPMADDUBSW on each byte's nibbles and VPMADDWD on Q6_K's codes)."""
    return _loaded is not None


def q8_supported(n: int, k: int) -> bool:
    return q4_supported(n, k) and q8_fast()


def q8_pack(codes: Tensor, scales: Tensor, minimums: Tensor) -> Tensor:
    """Blocks of up to 8-bit codes (uint8 [N, K], scales and minimums [N, K/32], w = code * scale + minimum) in
    q8_mm's layout: uint8 [N/16, K/32, 576]; the scales and minimums rounded to float16."""
    halves = [_per_block(v, torch.float16) for v in (scales, minimums)]
    return torch.cat([_byte_stream(codes), *halves], dim=-1).contiguous()


def q6_pack(codes: Tensor, scales: Tensor) -> Tensor:
    """Q6_K's signed codes (int8 [N, K], q - 32) and its scale per 16 weights (float32 [N, K/16]) in q6_mm's layout:
    uint8 [N/16, K/32, 704], per group of 32 the codes as q8_pack lays them, the scales of the first and the last 16
    inputs (float32), and each output's code sums over those halves (int16)."""
    n, k = codes.shape
    halves = scales.view(n, k // GROUP, 2)  # [N, K/32, 2]: the first 16 inputs' scale, the last 16's
    sums = codes.to(torch.int16).view(n, k // GROUP, 2, 16).sum(-1)  # [N, K/32, 2]
    parts = [_per_block(halves[..., h], torch.float32) for h in (0, 1)]
    parts += [_per_block(sums[..., h], torch.int16) for h in (0, 1)]
    return torch.cat([_byte_stream(codes), *parts], dim=-1).contiguous()


LAYOUTS = ("q4", "q8", "q6")  # the packed layouts: q4_pack's nibbles, q8_pack's bytes, q6_pack's Q6_K


def matmul(layout: str, x: Tensor, packed: Tensor, out_features: int, parts: int = 1, swiglu: bool = False) -> Tensor:
    """float32 y [M, N] = x [M, K] @ W.T for W packed in `layout`, with x rounded per group of 32 to `parts` int8
    parts (see `activation_parts`); `swiglu`: x is the gate and up projections' output [M, 2 K] (gate first) and the
    product silu(gate) * up is taken in the same call."""
    op = getattr(torch.ops.roundtrip, f"{layout}_mm_swiglu" if swiglu else f"{layout}_mm")
    y: Tensor = op(x, packed, out_features, parts)
    return y


def q4_mm(x: Tensor, packed: Tensor, out_features: int, parts: int = 1) -> Tensor:
    return matmul("q4", x, packed, out_features, parts)


def use_activations(setting: str) -> None:
    """How q4_mm rounds activations from now on in this process (`LoadConfig.q4_activations`): `int8` (default), one
    int8 per activation as llama.cpp rounds them; `int8x2`, two parts, about 15 bits, float32's results within about
    1e-4 for twice the multiplies (decode about 9% slower alone, batches of 8 to 16 rows twice as slow)."""
    global _activation_parts
    if setting not in ACTIVATION_SETTINGS:
        raise ValueError(f"ROUNDTRIP_Q4_ACTIVATIONS={setting!r}: use one of {', '.join(ACTIVATION_SETTINGS)}")
    _activation_parts = ACTIVATION_SETTINGS[setting]


def activation_parts() -> int:
    """int8 parts per activation in q4_mm, as `use_activations` last set it (1 until then)."""
    return _activation_parts


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / rms(x) * weight over the last dimension, float32 in and out."""
    y: Tensor = torch.ops.roundtrip.rms_norm(x, weight, eps)
    return y


def decode_attention(
    q: Tensor, keys: Tensor, values: Tensor, slots: Tensor, lengths: Tensor, scale: float, window: int = 0
) -> Tensor:
    """q [n, H, hd]; keys and values one layer of the cache [slots, KV, capacity, hd]; row i attends over the first
    lengths[i] positions of slot slots[i] (with a `window`, the last `window` of them). Returns [n, H, hd], float32."""
    y: Tensor = torch.ops.roundtrip.decode_attention(q, keys, values, slots, lengths, scale, window)
    return y


def roped_decode_attention(
    qkv: Tensor,
    rotations: Tensor,
    keys: Tensor,
    values: Tensor,
    slots: Tensor,
    lengths: Tensor,
    heads: int,
    scale: float,
    window: int = 0,
) -> Tensor:
    """A decode step's attention in one call: qkv [n, (H + 2 KV) * hd] as the projection gives it; rotations [n, R, 2]
    (RoPE's cos and sin at each row's position). Rotates queries and keys as `inference.model.apply_rope` does (the same
    bits), stores keys and values at position lengths[i] - 1 of slot slots[i] in one layer of the cache [slots, KV,
    capacity, hd], in place, and attends row i over its slot's first lengths[i] positions (the last `window` of them
    when window > 0). Returns [n, H * hd], float32."""
    y: Tensor = torch.ops.roundtrip.roped_decode_attention(
        qkv, rotations, keys, values, slots, lengths, heads, scale, window
    )
    return y


def row_summary(logits: Tensor) -> tuple[Tensor, Tensor]:
    """float32 logits [n, V] -> (logsumexp [n] float32, first index of each row's largest value [n] int64)."""
    log_z, best = torch.ops.roundtrip.row_summary(logits)
    return log_z, best


def near_best(logits: Tensor, margin: float) -> tuple[Tensor, Tensor]:
    """(rows, tokens) of the entries of float32 logits [n, V] within `margin` of their row's largest, in the order
    `(logits >= best - margin).nonzero(as_tuple=True)` gives them."""
    pairs: Tensor = torch.ops.roundtrip.near_best(logits, margin)  # [m, 2]
    return pairs[:, 0], pairs[:, 1]
