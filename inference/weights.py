"""How a linear layer's weight is kept in memory and multiplied: one small module per format.

Decoding one token reads every weight once, so on a CPU its speed is set by the bytes a
format reads per weight — and by whether torch has a kernel that multiplies that format
without expanding it first. The formats:

- `fp32`, `bf16`: dense, `F.linear`. bf16 halves the bytes; AMX or AVX512-BF16 make it fast.
- `int8`: one signed byte per weight, a bf16 scale per output row; `torch._weight_int8pack_mm`.
- `int4`: four bits per weight in groups of 32 with a scale and an offset each (`Q4Blocks`),
  packed for `torch._weight_int4pack_mm_for_cpu`. A GGUF's own Q4_1 blocks (a scale and a
  minimum per 32 weights) map onto it exactly, so the file's weights run as they are. `Int4Q8` keeps the
  same blocks in the layout of our int4 x int8 kernel (`inference.cpu_kernels`), where that one is faster.

The quantized kernels take bf16 inputs and give bf16 outputs, so every format but `fp32`
multiplies in bf16; a projection casts its input to that, and the residual stream, norms
and attention can stay in float32 around it. A `SizeDispatch` holds one weight in two formats and picks by how many
rows it multiplies:
a compact one for decode steps, a dense one for prompt chunks where the CPU's matrix units
win (see `inference.weight_choice`).
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference import cpu_kernels, int4_gemm

GROUP = 32  # weights per int4 group: GGUF's Q4_0/Q4_1 block size


class WeightFormat(str, Enum):
    FP32 = "fp32"
    BF16 = "bf16"
    INT8 = "int8"
    INT4 = "int4"

    @property
    def compute_dtype(self) -> torch.dtype:
        """What a projection of this format multiplies in."""
        return torch.float32 if self is WeightFormat.FP32 else torch.bfloat16

    @property
    def quantized(self) -> bool:
        return self in (WeightFormat.INT8, WeightFormat.INT4)


@dataclass
class Q4Blocks:
    """A weight [N, K] as codes of `bits` bits (4, or up to 8: a GGUF's 5-, 6- and 8-bit blocks) with a scale and a
    minimum per group of 32: w = code * scale + minimum."""

    codes: Tensor  # uint8 [N, K], values 0..2^bits - 1
    scales: Tensor  # float32 [N, K / 32]
    minimums: Tensor  # float32 [N, K / 32]
    bits: int = 4

    @classmethod
    def quantize(cls, weight: Tensor) -> Q4Blocks:
        """Round a dense weight to 4 bits per weight, each group spanning its own minimum..maximum."""
        n, k = weight.shape
        groups = weight.float().reshape(n, k // GROUP, GROUP)  # [N, K/32, 32]
        low, high = groups.amin(-1), groups.amax(-1)
        scales = ((high - low) / 15).clamp(min=1e-12)
        codes = ((groups - low[..., None]) / scales[..., None]).round().clamp(0, 15).to(torch.uint8)
        return cls(codes.reshape(n, k), scales, low)

    @classmethod
    def concat(cls, parts: list[Q4Blocks]) -> Q4Blocks:
        """Stack weights along their outputs (fused projections); 4-bit parts beside wider ones keep their codes, as
        bytes."""
        return cls(
            torch.cat([p.codes for p in parts]),
            torch.cat([p.scales for p in parts]),
            torch.cat([p.minimums for p in parts]),
            max(p.bits for p in parts),
        )

    def rows(self, order: Tensor) -> Q4Blocks:
        """The same weight with its output rows in `order`."""
        return Q4Blocks(self.codes[order], self.scales[order], self.minimums[order], self.bits)

    def dequantize(self) -> Tensor:
        n, k = self.codes.shape
        groups = self.codes.reshape(n, k // GROUP, GROUP).float()  # [N, K/32, 32]
        return (groups * self.scales[..., None] + self.minimums[..., None]).reshape(n, k)


@dataclass
class Q6Blocks:
    """A weight [N, K] as GGUF's Q6_K holds it: signed 6-bit codes and a scale per 16 weights, w = code * scale."""

    codes: Tensor  # int8 [N, K], -32..31
    scales: Tensor  # float32 [N, K / 16]

    def rows(self, order: Tensor) -> Q6Blocks:
        return Q6Blocks(self.codes[order], self.scales[order])

    def dequantize(self) -> Tensor:
        n, k = self.codes.shape
        return (self.codes.view(n, k // 16, 16).float() * self.scales[..., None]).reshape(n, k)


Blocks = Q4Blocks | Q6Blocks  # a file's own blocks, as a format may keep them


class Projection(nn.Module, metaclass=ABCMeta):
    """y = x @ W.T for one weight [out_features, in_features]; x is [rows, in_features], cast to the format's
    compute dtype, and y comes back in it (adding it to a float32 residual stream promotes it for free)."""

    format: WeightFormat
    in_features: int
    out_features: int
    has_rows = True  # whether `rows` can read single rows back (int4's packed layout cannot)

    def forward(self, x: Tensor) -> Tensor:
        return self.multiply(x.to(self.input_dtype))

    @property
    def input_dtype(self) -> torch.dtype:
        """What `multiply` takes: the format's compute dtype, unless the kernel converts its inputs itself."""
        return self.format.compute_dtype

    @abstractmethod
    def multiply(self, x: Tensor) -> Tensor:
        """x in `input_dtype`."""

    def swiglu(self, gate_up: Tensor) -> Tensor:
        """y = (silu(gate) * up) @ W.T for gate_up [rows, 2 in_features] (gate first): a SwiGLU feed-forward's down
        projection; formats with a fused kernel override it."""
        gate, up = gate_up.chunk(2, dim=-1)  # [rows, in_features] each
        return self(F.silu(gate) * up)

    @abstractmethod
    def rows(self, ids: Tensor) -> Tensor:
        """Rows `ids` of the weight as float32 [*ids.shape, in_features]: embedding lookups, exact logits for a few
        tokens (only where `has_rows`)."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """Tensors and settings that rebuild this projection (`restore`), for the weights cache."""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())


class Dense(Projection):
    weight: Tensor

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.format = WeightFormat.FP32 if weight.dtype == torch.float32 else WeightFormat.BF16
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)

    def multiply(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)

    def rows(self, ids: Tensor) -> Tensor:
        return self.weight[ids].float()

    def state(self) -> dict[str, Any]:
        return {"kind": "dense", "weight": self.weight}


class Int8(Projection):
    """Symmetric int8 per output row."""

    format = WeightFormat.INT8
    weight: Tensor
    scales: Tensor

    def __init__(self, weight: Tensor, scales: Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)  # int8 [N, K]
        self.register_buffer("scales", scales)  # bf16 [N]

    @classmethod
    def quantize(cls, weight: Tensor) -> Int8:
        w = weight.float()
        scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)  # [N]
        codes = (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
        return cls(codes, scales.to(torch.bfloat16))

    def multiply(self, x: Tensor) -> Tensor:
        return torch._weight_int8pack_mm(x, self.weight, self.scales)

    def rows(self, ids: Tensor) -> Tensor:
        return self.weight[ids].float() * self.scales[ids].float().unsqueeze(-1)

    def state(self) -> dict[str, Any]:
        return {"kind": "int8", "weight": self.weight, "scales": self.scales}


class PackedInt4(Projection):
    """int4 weights packed for a kernel, in groups of 32 with a scale and an offset each."""

    format = WeightFormat.INT4
    has_rows = False
    packed: Tensor

    def rows(self, ids: Tensor) -> Tensor:
        raise TypeError("int4's packed layouts have no readable rows: a Head keeps an Int8Rows table beside it")


class Int4(PackedInt4):
    """In the layout of torch's CPU int4 kernel; batches of more than `max_eager_rows` rows go through the compiled
    GEMM (`inference.int4_gemm`) once one is attached, on the same weights."""

    scales_and_zeros: Tensor

    def __init__(self, packed: Tensor, scales_and_zeros: Tensor, in_features: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = scales_and_zeros.shape[1]
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)  # bf16 [K/32, N, 2]
        self.gemm: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None  # attached after loading
        self.max_eager_rows = 0

    @classmethod
    def from_blocks(cls, blocks: Q4Blocks) -> Int4:
        """The kernel computes w = (code - 8) * scale + zero, so zero = minimum + 8 * scale: Q4_1 maps exactly
        (up to rounding the scale and zero to bf16)."""
        zeros = blocks.minimums + 8 * blocks.scales
        scales_and_zeros = torch.stack([blocks.scales, zeros], dim=-1).transpose(0, 1).contiguous()  # [K/32, N, 2]
        packed = torch._convert_weight_to_int4pack_for_cpu(blocks.codes.to(torch.int32), 1)
        return cls(packed, scales_and_zeros.to(torch.bfloat16), blocks.codes.shape[1])

    def sharing(self) -> Int4:
        """Another projection on the same weight tensors (no copy), with no GEMM attached."""
        return Int4(self.packed, self.scales_and_zeros, self.in_features)

    def attach(self, gemm: Callable[[Tensor, Tensor, Tensor], Tensor], max_eager_rows: int, check: bool = True) -> bool:
        """Let batches of more than `max_eager_rows` rows go through the compiled GEMM — if it agrees with the
        eager kernel on these weights (`check`); whether it does."""
        if not int4_gemm.supported(self.out_features, self.in_features) or (
            check and not int4_gemm.agrees(gemm, self.packed, self.scales_and_zeros)
        ):
            return False
        self.gemm, self.max_eager_rows = gemm, max(1, max_eager_rows)
        return True

    def multiply(self, x: Tensor) -> Tensor:
        if self.gemm is not None and x.shape[0] > self.max_eager_rows:
            return self.gemm(x, self.packed, self.scales_and_zeros)
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_and_zeros)

    def state(self) -> dict[str, Any]:
        return {
            "kind": "int4",
            "packed": self.packed,
            "scales_and_zeros": self.scales_and_zeros,
            "in_features": self.in_features,
        }


class Int4Q8(PackedInt4):
    """In the layout of our int4 x int8 kernel (`inference.cpu_kernels.matmul`): it takes float32 rows as they are
    (quantizing them to int8 itself) and gives float32 back, and a row's result does not depend on the others'.
    Its subclasses keep wider codes in the same kernel's other layouts; each names its layout and its weights cache
    kind."""

    input_dtype = torch.float32
    layout = "q4"  # cpu_kernels.LAYOUTS
    kind = "int4q8"

    def __init__(self, packed: Tensor, out_features: int, in_features: int) -> None:
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.register_buffer("packed", packed)  # uint8 [N/16, K/32, bytes per group of the layout]
        self.activation_parts = cpu_kernels.activation_parts()  # the setting, read once

    @classmethod
    def from_blocks(cls, blocks: Q4Blocks) -> Int4Q8:
        n, k = blocks.codes.shape
        return cls(cpu_kernels.q4_pack(blocks.codes, blocks.scales, blocks.minimums), n, k)

    def multiply(self, x: Tensor) -> Tensor:
        return cpu_kernels.matmul(self.layout, x, self.packed, self.out_features, self.activation_parts)

    def swiglu(self, gate_up: Tensor) -> Tensor:
        return cpu_kernels.matmul(
            self.layout, gate_up, self.packed, self.out_features, self.activation_parts, swiglu=True
        )

    def state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "packed": self.packed,
            "out_features": self.out_features,
            "in_features": self.in_features,
        }


class Int8Q8(Int4Q8):
    """Codes of up to 8 bits (a GGUF's Q5_0, Q5_1, Q8_0 and Q5_K blocks; Q6_K fused with those), one byte each: the
    int4 x int8 kernel's arithmetic on bytes."""

    format = WeightFormat.INT8
    layout, kind = "q8", "int8q8"

    @classmethod
    def from_blocks(cls, blocks: Q4Blocks) -> Int8Q8:
        n, k = blocks.codes.shape
        return cls(cpu_kernels.q8_pack(blocks.codes, blocks.scales, blocks.minimums), n, k)


class Int6Q8(Int4Q8):
    """GGUF's Q6_K blocks exactly (a scale per 16 weights)."""

    format = WeightFormat.INT8
    layout, kind = "q6", "int6q8"

    @classmethod
    def from_q6(cls, blocks: Q6Blocks) -> Int6Q8:
        n, k = blocks.codes.shape
        return cls(cpu_kernels.q6_pack(blocks.codes, blocks.scales), n, k)


class Int8Rows(nn.Module):
    """A matrix kept for reading rows: 8-bit codes with a float32 scale per group of 32 (GGUF's Q8_0 layout,
    so a Q8_0 tensor is kept exactly)."""

    codes: Tensor
    scales: Tensor

    def __init__(self, codes: Tensor, scales: Tensor) -> None:
        super().__init__()
        self.register_buffer("codes", codes)  # int8 [N, K]
        self.register_buffer("scales", scales)  # float32 [N, K / group]

    @classmethod
    def quantize(cls, weight: Tensor) -> Int8Rows:
        n, k = weight.shape
        group = GROUP if k % GROUP == 0 else k
        groups = weight.float().reshape(n, k // group, group)
        scales = (groups.abs().amax(-1) / 127).clamp(min=1e-12)  # [N, K / group]
        codes = (groups / scales[..., None]).round().clamp(-127, 127).to(torch.int8)
        return cls(codes.reshape(n, k), scales)

    def rows(self, ids: Tensor) -> Tensor:
        codes = self.codes[ids].float()  # [*, K]
        scales = self.scales[ids]  # [*, K / group]
        return (codes.unflatten(-1, (scales.shape[-1], -1)) * scales.unsqueeze(-1)).flatten(-2)


class Head(Projection):
    """An output head that is also the embedding table: a fast projection ranks every token, and 8-bit rows
    (the file's own Q8_0 values where it has them) give embeddings and exact logits for the likeliest tokens."""

    def __init__(self, ranking: Projection, table: Int8Rows) -> None:
        super().__init__()
        self.ranking, self.table = ranking, table
        self.format = ranking.format
        self.in_features, self.out_features = ranking.in_features, ranking.out_features

    @property
    def input_dtype(self) -> torch.dtype:
        return self.ranking.input_dtype

    def multiply(self, x: Tensor) -> Tensor:
        return self.ranking.multiply(x)

    def rows(self, ids: Tensor) -> Tensor:
        return self.table.rows(ids)

    def state(self) -> dict[str, Any]:
        return {"kind": "head", "ranking": self.ranking.state(), "codes": self.table.codes, "scales": self.table.scales}


class SizeDispatch(Projection):
    """The same weight in two formats: `small` for up to `max_small_rows` rows (decode steps), `large` above."""

    def __init__(self, small: Projection, large: Projection, max_small_rows: int) -> None:
        super().__init__()
        self.small, self.large, self.max_small_rows = small, large, max_small_rows
        self.format = small.format
        self.in_features, self.out_features = small.in_features, small.out_features

    def multiply(self, x: Tensor) -> Tensor:
        return self.small(x) if x.shape[0] <= self.max_small_rows else self.large(x)  # each casts to its own dtype

    def swiglu(self, gate_up: Tensor) -> Tensor:
        return (self.small if gate_up.shape[0] <= self.max_small_rows else self.large).swiglu(gate_up)

    @property
    def has_rows(self) -> bool:  # type: ignore[override]
        return self.large.has_rows or self.small.has_rows

    def rows(self, ids: Tensor) -> Tensor:
        return (self.large if self.large.has_rows else self.small).rows(ids)

    def state(self) -> dict[str, Any]:
        return {
            "kind": "dispatch",
            "small": self.small.state(),
            "large": self.large.state(),
            "max_small_rows": self.max_small_rows,
        }


def build(fmt: WeightFormat, dense: Tensor | None = None, blocks: Blocks | None = None, q8: bool = False) -> Projection:
    """A projection in `fmt` from float32 values, or for int4 from Q4 blocks (the file's own, when it has them);
    `q8`: int4 in the layout of our int4 x int8 kernel (where it takes the shape) instead of torch's, and wider
    blocks (a K-quant file's 5- to 8-bit ones, Q6_K's with its scale per 16) in its byte layouts where our kernel runs
    them (else rounded to 4 bits)."""
    if isinstance(blocks, Q6Blocks):  # Q6_K exactly through our kernel, else as values like any other
        if fmt is WeightFormat.INT4 and q8 and cpu_kernels.q8_supported(*blocks.codes.shape):
            return Int6Q8.from_q6(blocks)
        dense, blocks = blocks.dequantize() if dense is None else dense, None
    if fmt is WeightFormat.INT4 and blocks is not None and blocks.bits > 4:
        if q8 and cpu_kernels.q8_supported(*blocks.codes.shape):
            return Int8Q8.from_blocks(blocks)
        blocks = None
    if fmt is WeightFormat.INT4:
        four = Q4Blocks.quantize(dense) if blocks is None and dense is not None else blocks
        assert four is not None
        if q8 and cpu_kernels.q4_supported(*four.codes.shape):
            return Int4Q8.from_blocks(four)
        return Int4.from_blocks(four)
    if dense is None:
        assert blocks is not None
        dense = blocks.dequantize()
    if fmt is WeightFormat.INT8:
        return Int8.quantize(dense)
    return Dense(dense.to(fmt.compute_dtype).contiguous())


def restore(state: dict[str, Any]) -> Projection:
    kind = state["kind"]
    if kind == "dense":
        return Dense(state["weight"])
    if kind == "int8":
        return Int8(state["weight"], state["scales"])
    if kind == "int4":
        return Int4(state["packed"], state["scales_and_zeros"], int(state["in_features"]))
    packed_kinds = {c.kind: c for c in (Int4Q8, Int8Q8, Int6Q8)}
    if kind in packed_kinds:
        return packed_kinds[kind](state["packed"], int(state["out_features"]), int(state["in_features"]))
    if kind == "head":
        return Head(restore(state["ranking"]), Int8Rows(state["codes"], state["scales"]))
    if kind == "dispatch":
        return SizeDispatch(restore(state["small"]), restore(state["large"]), int(state["max_small_rows"]))
    raise ValueError(f"unknown projection kind {kind!r}")


def supports_int4(out_features: int, in_features: int) -> bool:
    """The CPU int4 kernel wants whole groups along the input and a multiple of its tile along the output."""
    return in_features % GROUP == 0 and out_features % 16 == 0
