"""A LLaMA-family model's weights in the chosen format, read from its GGUF file one tensor at a time.

Names follow the checkpoint's (`blk.N.attn_norm`, `token_embd`, ...). Two projections are
fused, as llama.cpp names them for architectures that store them fused: `attn_qkv` (the
file's attn_q, attn_k and attn_v stacked along their outputs) and `ffn_gate_up` (ffn_gate
and ffn_up): one matrix multiplication instead of three and two.

Building reads one tensor, converts it and lets it go, so the process never holds the
whole model in float32 (peak memory is the final weights plus the largest tensor). 4-bit
formats take a Q4_0/Q4_1 file's own blocks, without re-rounding them.

The embedding and the output head (one matrix when tied) are kept densely in a dense plan;
beside quantized layers they are a `Head`: the decode format ranks every token and 8-bit
rows — the file's own Q8_0 values when it stores them so — give embedding lookups and the
exact logits of the likeliest tokens. Greedy text depends on the head's precision far more
than on the layers' (a 4-bit head flips near-ties that llama.cpp's 8-bit one does not).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from inference import weights as w
from inference.config import ModelConfig
from inference.errors import ModelFileError
from inference.gguf_file import GGUFFile
from inference.weight_choice import WeightPlan

ATTN_QKV = ("attn_q", "attn_k", "attn_v")
FFN_GATE_UP = ("ffn_gate", "ffn_up")
BLOCK_TENSORS = ("attn_norm", *ATTN_QKV, "attn_output", "ffn_norm", *FFN_GATE_UP, "ffn_down")


@dataclass
class BlockWeights:
    attn_norm: Tensor
    attn_qkv: w.Projection
    attn_output: w.Projection
    ffn_norm: Tensor
    ffn_gate_up: w.Projection
    ffn_down: w.Projection


@dataclass
class ModelWeights:
    token_embd: w.Projection  # [V, dim]: rows are looked up (the same object as `output` when tied)
    blocks: list[BlockWeights]
    output_norm: Tensor
    output: w.Projection  # [V, dim]
    plan: WeightPlan

    @property
    def nbytes(self) -> int:
        projections = [self.output] + [
            p for b in self.blocks for p in (b.attn_qkv, b.attn_output, b.ffn_gate_up, b.ffn_down)
        ]
        if self.token_embd is not self.output:
            projections.append(self.token_embd)
        tensors = [self.output_norm] + [t for b in self.blocks for t in (b.attn_norm, b.ffn_norm)]
        return sum(p.nbytes for p in projections) + sum(t.numel() * t.element_size() for t in tensors)

    def state(self) -> dict[str, Any]:
        """Everything as plain tensors and dicts, for `torch.save` in the weights cache."""
        return {
            "plan": self.plan.key,
            "token_embd": None if self.token_embd is self.output else self.token_embd.state(),
            "output_norm": self.output_norm,
            "output": self.output.state(),
            "blocks": [
                {
                    "attn_norm": b.attn_norm,
                    "attn_qkv": b.attn_qkv.state(),
                    "attn_output": b.attn_output.state(),
                    "ffn_norm": b.ffn_norm,
                    "ffn_gate_up": b.ffn_gate_up.state(),
                    "ffn_down": b.ffn_down.state(),
                }
                for b in self.blocks
            ],
        }

    @classmethod
    def restore(cls, state: dict[str, Any], plan: WeightPlan) -> ModelWeights:
        blocks = [
            BlockWeights(
                b["attn_norm"],
                w.restore(b["attn_qkv"]),
                w.restore(b["attn_output"]),
                b["ffn_norm"],
                w.restore(b["ffn_gate_up"]),
                w.restore(b["ffn_down"]),
            )
            for b in state["blocks"]
        ]
        output = w.restore(state["output"])
        token_embd = output if state["token_embd"] is None else w.restore(state["token_embd"])
        return cls(token_embd, blocks, state["output_norm"], output, plan)


def expected_tensors(config: ModelConfig, gguf: GGUFFile) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"]
    names += [f"blk.{i}.{t}.weight" for i in range(config.n_layers) for t in BLOCK_TENSORS]
    if gguf.has_tensor("output.weight"):
        names.append("output.weight")
    return names


def read(
    gguf: GGUFFile, config: ModelConfig, plan: WeightPlan, on_tensor: Callable[[int, int, str], None] | None = None
) -> ModelWeights:
    """Build every weight in `plan`'s formats; `on_tensor(done, total, name)` reports progress."""
    reader = WeightReader(gguf, plan, len(expected_tensors(config, gguf)), on_tensor)
    c = config
    blocks = [reader.block(f"blk.{i}.", c) for i in range(c.n_layers)]
    token_embd = reader.head("token_embd", c)
    output = reader.head("output", c) if gguf.has_tensor("output.weight") else token_embd
    return ModelWeights(token_embd, blocks, reader.vector("output_norm", c.dim), output, plan)


class WeightReader:
    """Reads a file's tensors one at a time, checking each one's shape, into the plan's formats."""

    def __init__(
        self, gguf: GGUFFile, plan: WeightPlan, total: int, on_tensor: Callable[[int, int, str], None] | None
    ) -> None:
        self.gguf, self.plan, self.total, self.on_tensor = gguf, plan, total, on_tensor
        self.done = 0

    def source(self, name: str, shape: tuple[int, ...]) -> tuple[Tensor, w.Q4Blocks | None]:
        """A tensor's float32 values, and its 4-bit blocks when the plan's 4-bit format can use the file's own."""
        full = f"{name}.weight"
        blocks = None
        if self.plan.uses(w.WeightFormat.INT4):
            raw = self.gguf.q4_blocks(full)
            if raw is not None:
                blocks = w.Q4Blocks(*(torch.from_numpy(a) for a in raw))
        dense = torch.from_numpy(self.gguf.dequantize(full)) if blocks is None else blocks.dequantize()
        if tuple(dense.shape) != shape:
            raise ModelFileError(self.gguf.path, f"tensor {full!r} has shape {tuple(dense.shape)}, expected {shape}")
        self.done += 1
        if self.on_tensor is not None:
            self.on_tensor(self.done, self.total, full)
        return dense, blocks

    def vector(self, name: str, size: int) -> Tensor:
        return self.source(name, (size,))[0]  # float32; the model keeps norms in its stream's dtype

    def projection(self, names: tuple[str, ...], shapes: list[tuple[int, int]]) -> w.Projection:
        """One projection from one or more tensors stacked along the outputs (q, k and v; gate and up)."""
        parts = [self.source(n, s) for n, s in zip(names, shapes)]
        dense = torch.cat([d for d, _ in parts])  # [sum of outputs, inputs]
        found = [b for _, b in parts if b is not None]
        return self.plan.build(dense, w.Q4Blocks.concat(found) if len(found) == len(parts) else None)

    def block(self, p: str, c: ModelConfig) -> BlockWeights:
        hd = c.head_dim
        return BlockWeights(
            attn_norm=self.vector(p + "attn_norm", c.dim),
            attn_qkv=self.projection(
                tuple(p + n for n in ATTN_QKV),
                [(c.n_heads * hd, c.dim), (c.n_kv_heads * hd, c.dim), (c.n_kv_heads * hd, c.dim)],
            ),
            attn_output=self.projection((p + "attn_output",), [(c.dim, c.n_heads * hd)]),
            ffn_norm=self.vector(p + "ffn_norm", c.dim),
            ffn_gate_up=self.projection(tuple(p + n for n in FFN_GATE_UP), [(c.ffn_dim, c.dim), (c.ffn_dim, c.dim)]),
            ffn_down=self.projection((p + "ffn_down",), [(c.dim, c.ffn_dim)]),
        )

    def head(self, name: str, c: ModelConfig) -> w.Projection:
        """An embedding or output head: exact 8-bit rows from the file's own Q8_0 blocks where the plan quantizes."""
        q8 = self.gguf.q8_blocks(f"{name}.weight") if self.plan.decode.quantized else None
        dense = self.source(name, (c.vocab_size, c.dim))[0]
        return self.plan.build_head(dense, None if q8 is None else (torch.from_numpy(q8[0]), torch.from_numpy(q8[1])))
