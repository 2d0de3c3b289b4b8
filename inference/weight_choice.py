"""Which weight format the model runs in: from the `ROUNDTRIP_WEIGHTS` setting, or measured on this CPU.

Settings: `fp32`, `bf16`, `int8`, `int4`; `DECODE+PREFILL` (e.g. `int4+bf16`) to keep a second
copy for multiplying many rows at once; `auto` (the default). On CUDA `auto` is bf16. On a CPU
the ranking depends on the chip — on one with AMX bf16 dense wins for prompt-sized batches
while int4 wins for decode steps; on one without, bf16 may be emulated and slow — so `auto`
times each format on matrices of this model's shapes (under a second) and keeps:

- for decode steps, the format fastest at one row;
- above some row count, another format if it is clearly faster for
  prompt-sized batches; `max_decode_rows` is the last measured size where the decode format
  still keeps up. This doubles the weights' memory, which `int4` alone avoids.

The decision is remembered per CPU, torch version and model shape (`remember`), so a
restart loads the same cached weights instead of measuring again.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from inference.config import ModelConfig
from inference.weights import Head, Int8, Int8Rows, Projection, Q4Blocks, SizeDispatch, WeightFormat, build, supports_int4

ROWS = (1, 2, 4, 8, 16, 32, 64)
PREFILL_ROWS = 64
CLEAR_WIN = 1.3  # a second format must be this much faster on prompt-sized batches to be worth its memory
SAMPLE_LAYERS = 4  # enough matrices that they do not all sit in the CPU's caches, as real weights do not


@dataclass(frozen=True)
class WeightPlan:
    decode: WeightFormat
    prefill: WeightFormat | None = None
    max_decode_rows: int = 0  # with a prefill format: batches of more rows than this use it

    @property
    def key(self) -> str:
        return self.decode.value if self.prefill is None else f"{self.decode.value}+{self.prefill.value}@{self.max_decode_rows}"

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the decode format's multiplications (and of a kept embedding)."""
        return self.decode.compute_dtype

    def uses(self, fmt: WeightFormat) -> bool:
        return fmt in (self.decode, self.prefill)

    def describe(self) -> str:
        head = " (head: int8 rows)" if self.decode.quantized else ""
        if self.prefill is None:
            return self.decode.value + head
        return f"{self.decode.value}, {self.prefill.value} above {self.max_decode_rows} rows{head}"

    def build(self, dense: Tensor, blocks: Q4Blocks | None = None) -> Projection:
        """One weight in this plan: a 4-bit format falls back to int8 for shapes its kernel cannot take."""
        small = _build_one(self.decode, dense, blocks)
        if self.prefill is None:
            return small
        return SizeDispatch(small, _build_one(self.prefill, dense, blocks), self.max_decode_rows)


    def build_head(self, dense: Tensor, q8: tuple[Tensor, Tensor] | None = None) -> Projection:
        """The output head / embedding table (see `inference.model_weights`): dense in a dense plan; beside
        quantized layers, the decode format ranks and 8-bit rows (`q8`: the file's own Q8_0 blocks) are exact."""
        if not self.decode.quantized:
            return self.build(dense)
        table = Int8Rows(*q8) if q8 is not None else Int8Rows.quantize(dense)
        return Head(_build_one(self.decode, dense, None), table)


def _build_one(fmt: WeightFormat, dense: Tensor, blocks: Q4Blocks | None) -> Projection:
    if fmt is WeightFormat.INT4 and not supports_int4(*dense.shape):
        return Int8.quantize(dense)
    return build(fmt, dense, blocks)


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
        raise ValueError(f"ROUNDTRIP_WEIGHTS={setting!r}: use auto, one of {allowed}, or two joined by '+' (e.g. int4+bf16)") from None
    if len(formats) > 2:
        raise ValueError(f"ROUNDTRIP_WEIGHTS={setting!r}: at most two formats (decode+prefill)")
    if device.type != "cpu" and any(f.quantized for f in formats):
        raise ValueError(f"ROUNDTRIP_WEIGHTS={setting!r}: int8 and int4 kernels run on the CPU; use bf16 or fp32 on {device.type}")
    if len(formats) == 2:
        return WeightPlan(formats[0], formats[1], 16)
    return WeightPlan(formats[0])


def choose(config: ModelConfig, device: torch.device, setting: str, cache_dir: Path | None = None) -> WeightPlan:
    """The plan for this model on this device: the setting's, else remembered, else measured (and remembered)."""
    plan = parse(setting, device)
    if plan is not None:
        return plan
    if device.type != "cpu":
        return WeightPlan(WeightFormat.BF16)
    memo = _memo_path(config, cache_dir) if cache_dir is not None else None
    if memo is not None and memo.exists():
        try:
            saved = json.loads(memo.read_text())
            prefill = WeightFormat(saved["prefill"]) if saved["prefill"] else None
            return WeightPlan(WeightFormat(saved["decode"]), prefill, int(saved["max_decode_rows"]))
        except (OSError, ValueError, KeyError):
            pass
    timings = measure(config)
    plan = decide(timings)
    if memo is not None:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            memo.write_text(json.dumps({"decode": plan.decode.value, "prefill": plan.prefill.value if plan.prefill else None,
                                        "max_decode_rows": plan.max_decode_rows,
                                        "timings_ms": {f.value: {str(r): t * 1000 for r, t in row.items()} for f, row in timings.items()}}))
        except OSError:
            pass
    return plan


Timings = dict[WeightFormat, dict[int, float]]  # seconds for one sample of layers, by format and row count


def measure(config: ModelConfig, rows: tuple[int, ...] = ROWS) -> Timings:
    """Time each format on a few layers' worth of matrices of this model's shapes, at each row count."""
    c = config
    shapes = [(c.dim + 2 * c.n_kv_heads * c.head_dim, c.dim), (c.dim, c.n_heads * c.head_dim), (2 * c.ffn_dim, c.dim), (c.dim, c.ffn_dim)]
    generator = torch.Generator().manual_seed(0)
    dense = [torch.randn(s, generator=generator) * 0.02 for _ in range(min(SAMPLE_LAYERS, c.n_layers)) for s in shapes]
    timings: Timings = {}
    for fmt in WeightFormat:
        if fmt is WeightFormat.INT4 and not all(supports_int4(*d.shape) for d in dense):
            continue
        try:
            projections = [build(fmt, d) for d in dense]
            timings[fmt] = {n: _time(projections, torch.randn(n, c.dim), c) for n in rows}
        except RuntimeError:  # a kernel this build of torch lacks on this CPU
            continue
    return timings


def _time(projections: list[Projection], x: Tensor, config: ModelConfig) -> float:
    inputs = {config.dim: x, config.ffn_dim: x.new_zeros(x.shape[0], config.ffn_dim)}

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


def decide(timings: Timings) -> WeightPlan:
    """The fastest format at one row for decoding; a second for prompt-sized batches when it clearly wins there."""
    decode = min(timings, key=lambda f: timings[f][1])
    prefill = min(timings, key=lambda f: timings[f][PREFILL_ROWS])
    if prefill is decode or timings[decode][PREFILL_ROWS] < CLEAR_WIN * timings[prefill][PREFILL_ROWS]:
        return WeightPlan(decode)
    keeps_up = [n for n in sorted(timings[decode]) if timings[decode][n] <= timings[prefill][n]]
    return WeightPlan(decode, prefill, max(keeps_up, default=1))


def _memo_path(config: ModelConfig, cache_dir: Path) -> Path:
    cpu = _cpu_name()
    key = f"{cpu}|{torch.__version__}|{torch.get_num_threads()}|{config.dim}|{config.ffn_dim}|{config.n_heads}|{config.n_kv_heads}"
    return cache_dir / f"weight-choice-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

