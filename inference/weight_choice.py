"""Which weight format the model runs in: from the `ROUNDTRIP_WEIGHTS` setting, or measured on this CPU.

Settings: `fp32`, `bf16`, `int8`, `int4` (one copy of each matrix); `DECODE+PREFILL` (e.g.
`int4+bf16`) to keep a second copy for multiplying many rows at once; `auto` (the default). On CUDA `auto` is
bf16. On a CPU the ranking depends on the chip (with AMX, bf16 is fast for prompt-sized batches and
int4's eager kernel for decode steps; without AVX512-BF16, bf16 is emulated and slow), so `auto`
times each format on matrices of this model's shapes (about a second) and keeps:

- for decode steps, the format fastest at one row — or a more compact one within `NEAR_TIE` of it: int4
  keeps a Q4 file's own blocks exactly (the others re-quantize or expand them, and on this model
  int8 departs from llama.cpp's greedy text early), and less memory is worth a few percent;
- int4's compiled GEMM (`inference.int4_gemm`, CPUs with AMX) above the row count where it
  beats the eager int4 kernel — it reads the same weights, so it costs no memory (prefill and
  batched decode steps several times faster);
- or, instead of torch's int4 kernels, our int4 x int8 kernel (`inference.cpu_kernels`, CPUs with
  AVX512-VNNI or AVX2) when it is faster over the batch sizes a serving engine decodes (1 to 16 rows): it
  keeps the weights in a layout of its own, so it replaces the other two rather than joining them;
- one copy of the weights: a second format for prompt-sized batches costs its weights' memory again
  (bf16 beside int4: 328 MB instead of 116), more than a served default model may hold, so `auto`
  keeps one only when the setting asks for it (`int4+bf16`).

The decision is remembered per CPU, torch version and model shape, so a restart loads the same
cached weights instead of measuring again.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from inference import cpu_kernels, int4_gemm
from inference.config import ModelConfig
from inference.weights import (
    Blocks,
    Head,
    Int4,
    Int8,
    Int8Rows,
    Projection,
    SizeDispatch,
    WeightFormat,
    build,
    supports_int4,
)

ROWS = (1, 2, 4, 8, 16, 32, 64)
NEAR_TIE = 1.15  # a more compact decode format this close to the fastest wins (timings on a busy machine wobble more)
COMPACT_FIRST = (WeightFormat.INT4, WeightFormat.INT8, WeightFormat.BF16, WeightFormat.FP32)
SAMPLE_LAYERS = 4  # enough matrices that they do not all sit in the CPU's caches, as real weights do not
ROUNDS = 3  # the formats take turns this many times; each keeps its best
COMPILED = "int4 compiled GEMM"  # int4 through the compiled GEMM, measured beside the formats
Q8 = "int4 x int8 kernel"  # int4 in the layout of our int4 x int8 kernel, measured beside the formats
SERVING_ROWS = (1, 2, 4, 8, 16)  # the batch sizes of decode steps, where the int4 kernels are compared

Kernels = dict[int4_gemm.Shape, int4_gemm.Kernel]


@dataclass(frozen=True)
class WeightPlan:
    decode: WeightFormat
    prefill: WeightFormat | None = None
    max_decode_rows: int = 0  # with a prefill format: batches of more rows than this use it
    gemm_above: int = 0  # int4 batches of more rows than this use the compiled GEMM (0: never)
    q8: bool = False  # int4 is kept in our int4 x int8 kernel's layout and multiplied by it

    @property
    def key(self) -> str:
        """What the weights in memory are (the compiled GEMM reads int4's own, so it is not part of it)."""
        decode = self.decode.value + ("-q8" if self.q8 else "")
        return decode if self.prefill is None else f"{decode}+{self.prefill.value}@{self.max_decode_rows}"

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the decode format's multiplications."""
        return self.decode.compute_dtype

    def uses(self, fmt: WeightFormat) -> bool:
        return fmt in (self.decode, self.prefill)

    def describe(self) -> str:
        text = self.decode.value
        if self.q8:
            text += f" (int8 x int4 kernel, {cpu_kernels.describe()})"
        if self.gemm_above:
            text += f" (compiled AMX GEMM above {self.gemm_above} rows)"
        if self.prefill is not None:
            text += f", {self.prefill.value} above {self.max_decode_rows} rows"
        return text + (", head int8 rows" if self.decode.quantized else "")

    def build(self, dense: Tensor, blocks: Blocks | None = None) -> Projection:
        """One weight in this plan: a 4-bit format falls back to int8 for shapes its kernel cannot take."""
        small = self._build_one(self.decode, dense, blocks)
        if self.prefill is None:
            return small
        return SizeDispatch(small, self._build_one(self.prefill, dense, blocks), self.max_decode_rows)

    def build_head(self, dense: Tensor, q8: tuple[Tensor, Tensor] | None = None) -> Projection:
        """The output head / embedding table (see `inference.model_weights`): dense in a dense plan; beside
        quantized layers, the decode format ranks and 8-bit rows (`q8`: the file's own Q8_0 blocks) are exact."""
        if not self.decode.quantized:
            return self.build(dense)
        table = Int8Rows(*q8) if q8 is not None else Int8Rows.quantize(dense)
        return Head(self._build_one(self.decode, dense, None), table)

    def _build_one(self, fmt: WeightFormat, dense: Tensor, blocks: Blocks | None) -> Projection:
        if fmt is WeightFormat.INT4 and not supports_int4(*dense.shape):
            return Int8.quantize(dense)
        return build(fmt, dense, blocks, q8=self.q8)


def model_shapes(config: ModelConfig) -> list[int4_gemm.Shape]:
    """(out, in) of every projection: fused QKV, attention output, fused gate/up, down, and the head."""
    c = config
    return [
        (c.q_dim + 2 * c.n_kv_heads * c.head_dim, c.dim),
        (c.dim, c.q_dim),
        (2 * c.ffn_dim, c.dim),
        (c.dim, c.ffn_dim),
        (c.vocab_size, c.dim),
    ]


def parse(setting: str, device: torch.device) -> WeightPlan | None:
    """The plan a setting names, or None for `auto`; a ValueError says what is allowed."""
    setting = setting.strip().lower()
    if setting in ("", "auto"):
        return None
    names = [n.strip() for n in setting.split("+")]
    allowed = ", ".join(f.value for f in WeightFormat)
    try:
        formats = [WeightFormat(n) for n in names]
    except ValueError:
        raise ValueError(
            f"ROUNDTRIP_WEIGHTS={setting!r}: use auto, one of {allowed}, or two joined by '+' (e.g. int4+bf16)"
        ) from None
    if len(formats) > 2:
        raise ValueError(f"ROUNDTRIP_WEIGHTS={setting!r}: at most two formats (decode+prefill)")
    if device.type != "cpu" and any(f.quantized for f in formats):
        raise ValueError(
            f"ROUNDTRIP_WEIGHTS={setting!r}: int8 and int4 kernels run on the CPU; use bf16 or fp32 on {device.type}"
        )
    if len(formats) == 2:
        return WeightPlan(formats[0], formats[1], 16)
    return WeightPlan(formats[0])


def choose(
    config: ModelConfig,
    device: torch.device,
    setting: str,
    cache_dir: Path | None = None,
    report: Callable[[str], None] = lambda note: None,
    compiled_gemm: bool = True,
    wide_blocks: bool = False,
) -> tuple[WeightPlan, Kernels | None]:
    """The plan for this model on this device — the setting's, else remembered (in `cache_dir`), else measured
    (and remembered) — and the compiled int4 GEMM kernels when the plan uses them (never unless `compiled_gemm`).
    Our int4 x int8 kernel is a candidate when our CPU kernels are loaded (`inference.cpu_kernels`).

    `wide_blocks`: the file holds 5- to 8-bit blocks (a K-quant file's Q5_0, Q6_K, Q8_0...). Only our kernels run
    those as they are (`q8_mm`); torch's int4 kernels would round them to 4 bits, which moved Gemma 3's greedy text
    off llama.cpp's within a few tokens. So an int4 plan takes our kernels for such a file whatever the timing."""
    plan, kernels = _choose(config, device, setting, cache_dir, report, compiled_gemm)
    if wide_blocks and plan.uses(WeightFormat.INT4) and not plan.q8 and cpu_kernels.q8_fast():
        return WeightPlan(plan.decode, plan.prefill, plan.max_decode_rows, q8=True), None
    return plan, kernels


def _choose(
    config: ModelConfig,
    device: torch.device,
    setting: str,
    cache_dir: Path | None,
    report: Callable[[str], None],
    compiled_gemm: bool,
) -> tuple[WeightPlan, Kernels | None]:
    plan = parse(setting, device)
    if device.type != "cpu":
        return plan or WeightPlan(WeightFormat.BF16), None
    if plan is not None and not plan.uses(WeightFormat.INT4):
        return plan, None
    q8 = cpu_kernels.is_loaded()
    kernels = (
        int4_gemm.load(model_shapes(config), cache_dir, report) if cache_dir is not None and compiled_gemm else None
    )
    if plan is not None and kernels is None and not q8:
        return plan, None
    q8_kernel = f"{cpu_kernels.loaded_isa()}x{cpu_kernels.activation_parts()}" if q8 else ""
    memo = _memo_path(config, cache_dir, setting, kernels is not None, q8_kernel) if cache_dir is not None else None
    remembered = _recall(memo)
    if remembered is not None:
        return remembered, kernels if remembered.gemm_above else None
    report("measuring which weight format is fastest on this CPU")
    quiet = _machine_is_quiet()
    timings, compiled, q8_times = measure(config, kernels, q8=q8)
    quiet = quiet and _machine_is_quiet()
    plan = decide(timings, compiled, q8_times) if plan is None else _int4_kernel(plan, timings, compiled, q8_times)
    if memo is not None and quiet:
        _remember(memo, plan, timings, compiled, q8_times)
    elif memo is not None:
        report(
            "the CPU was busy with other work while measuring: this choice is not remembered, the next start measures "
            "again"
        )
    return plan, kernels if plan.gemm_above else None


def _machine_is_quiet() -> bool:
    """Whether other work leaves this process the CPUs: a measurement taken beside a compiler or a benchmark
    ranks the formats by who was interrupted, and must not be kept for every later start."""
    cpus = os.cpu_count() or 1
    return os.getloadavg()[0] <= cpus


Timings = dict[WeightFormat, dict[int, float]]  # seconds for one sample of layers, by format and row count


def measure(
    config: ModelConfig, kernels: Kernels | None = None, rows: tuple[int, ...] = ROWS, q8: bool = False
) -> tuple[Timings, dict[int, float], dict[int, float]]:
    """Time each format on a few layers' worth of matrices of this model's shapes, at each row count;
    int4 through the compiled GEMM (from 2 rows) when `kernels` are given, and int4 through our int4 x int8 kernel
    when `q8` (it is loaded).

    The formats take turns over `ROUNDS` rounds and each keeps its best time, so a burst of other work on the
    machine slows every format alike instead of deciding the ranking by when it happened to hit."""
    c = config
    generator = torch.Generator().manual_seed(0)
    dense = [
        torch.randn(s, generator=generator) * 0.02
        for _ in range(min(SAMPLE_LAYERS, c.n_layers))
        for s in model_shapes(c)[:4]
    ]
    candidates: dict[WeightFormat | str, tuple[list[Projection], tuple[int, ...]]] = {}
    for fmt in WeightFormat:
        if fmt is WeightFormat.INT4 and not all(supports_int4(*d.shape) for d in dense):
            continue
        try:
            candidates[fmt] = ([build(fmt, d) for d in dense], rows)
        except RuntimeError:  # a kernel this build of torch lacks on this CPU
            continue
        if fmt is WeightFormat.INT4 and kernels is not None:
            compiled: list[Projection] = []
            for eager in candidates[fmt][0]:
                p = eager.sharing() if isinstance(eager, Int4) else eager
                if isinstance(p, Int4) and (p.out_features, p.in_features) in kernels:
                    p.attach(kernels[(p.out_features, p.in_features)], 1, check=False)
                compiled.append(p)
            candidates[COMPILED] = (compiled, tuple(n for n in rows if n > 1))
        if fmt is WeightFormat.INT4 and q8:
            candidates[Q8] = ([build(fmt, d, q8=True) for d in dense], rows)
    inputs = {n: torch.randn(n, c.dim) for n in rows}
    best: dict[WeightFormat | str, dict[int, float]] = {
        key: {n: float("inf") for n in counts} for key, (_, counts) in candidates.items()
    }
    for _ in range(ROUNDS):
        for key, (projections, counts) in candidates.items():
            for n in counts:
                best[key][n] = min(best[key][n], _time(projections, inputs[n], c))
    compiled_times = best.pop(COMPILED, {})
    q8_times = best.pop(Q8, {})
    return {WeightFormat(k): v for k, v in best.items()}, compiled_times, q8_times


def _time(projections: list[Projection], x: Tensor, config: ModelConfig) -> float:
    inputs = {
        n: x if n == config.dim else x.new_zeros(x.shape[0], n) for n in (config.dim, config.q_dim, config.ffn_dim)
    }

    def run() -> None:
        for p in projections:
            p(inputs[p.in_features])

    run()  # warm-up: kernel selection, first touches
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def _gemm_above(timings: Timings, compiled: dict[int, float]) -> int:
    """The last measured row count at which the eager int4 kernel is still at least as fast as the compiled GEMM."""
    eager = timings[WeightFormat.INT4]
    return max((n for n in sorted(eager) if n not in compiled or eager[n] <= compiled[n]), default=1)


def _q8_wins(timings: Timings, compiled: dict[int, float] | None, q8: dict[int, float] | None) -> bool:
    """Whether int4 through our int4 x int8 kernel beats torch's int4 kernels (eager, or compiled where faster) over the
    batch sizes of decode steps."""
    if not q8 or WeightFormat.INT4 not in timings:
        return False
    eager, compiled = timings[WeightFormat.INT4], compiled or {}
    torch_total = sum(min(eager[n], compiled.get(n, eager[n])) for n in SERVING_ROWS if n in eager)
    return sum(q8[n] for n in SERVING_ROWS if n in eager) < torch_total


def _int4_kernel(plan: WeightPlan, timings: Timings, compiled: dict[int, float], q8: dict[int, float]) -> WeightPlan:
    """A set plan's int4 kernels: our int4 x int8 kernel where it wins, else torch's compiled GEMM above its
    crossover."""
    if _q8_wins(timings, compiled, q8):
        return WeightPlan(plan.decode, plan.prefill, plan.max_decode_rows, q8=True)
    return WeightPlan(
        plan.decode, plan.prefill, plan.max_decode_rows, _gemm_above(timings, compiled) if compiled else 0
    )


def decide(
    timings: Timings, compiled: dict[int, float] | None = None, q8: dict[int, float] | None = None
) -> WeightPlan:
    """The fastest format at one row for decoding, with int4's faster kernel (our int4 x int8 one, or the compiled GEMM
    for
    larger batches where it helps). One copy of the weights: a second format for prompts is kept only when asked
    for (`int4+bf16`), since a served default model must stay within its memory budget."""
    use_q8 = _q8_wins(timings, compiled, q8)
    if use_q8:
        timings, compiled = {**timings, WeightFormat.INT4: q8 or {}}, None
    fastest = min(timings, key=lambda f: timings[f][1])
    decode = next(
        f for f in COMPACT_FIRST if f is fastest or (f in timings and timings[f][1] <= NEAR_TIE * timings[fastest][1])
    )
    gemm_above = _gemm_above(timings, compiled) if compiled and decode is WeightFormat.INT4 else 0
    return WeightPlan(decode, gemm_above=gemm_above, q8=use_q8 and decode is WeightFormat.INT4)


def _memo_path(config: ModelConfig, cache_dir: Path, setting: str, compiled: bool, q8_kernel: str) -> Path:
    """`q8_kernel`: our int4 x int8 kernel's instruction set and int8 parts per activation (its speed depends on
    them), empty without it."""
    key = (
        f"{int4_gemm._cpu_model()}|{torch.__version__}|{torch.get_num_threads()}|{config.dim}|{config.ffn_dim}|{config.n_heads}|"
        f"{config.n_kv_heads}|{config.vocab_size}|{setting}|{compiled}|{q8_kernel}"
    )
    return cache_dir / f"weight-choice-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _recall(memo: Path | None) -> WeightPlan | None:
    if memo is None or not memo.exists():
        return None
    try:
        saved = json.loads(memo.read_text())
        prefill = WeightFormat(saved["prefill"]) if saved["prefill"] else None
        return WeightPlan(
            WeightFormat(saved["decode"]),
            prefill,
            int(saved["max_decode_rows"]),
            int(saved["gemm_above"]),
            bool(saved["q8"]),
        )
    except (OSError, ValueError, KeyError):
        return None


def _remember(memo: Path, plan: WeightPlan, timings: Timings, compiled: dict[int, float], q8: dict[int, float]) -> None:
    """The decision and the measurements behind it (milliseconds), for the next start and for curious people."""
    record = {
        "decode": plan.decode.value,
        "prefill": plan.prefill.value if plan.prefill else None,
        "max_decode_rows": plan.max_decode_rows,
        "gemm_above": plan.gemm_above,
        "q8": plan.q8,
        "timings_ms": {f.value: {str(r): t * 1000 for r, t in row.items()} for f, row in timings.items()},
        "int4_compiled_gemm_ms": {str(r): t * 1000 for r, t in compiled.items()},
        "int4_q8_ms": {str(r): t * 1000 for r, t in q8.items()},
    }
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(json.dumps(record))
    except OSError:
        pass
