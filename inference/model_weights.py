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
    total = len(expected_tensors(config, gguf))
    done = 0

    def source(name: str, shape: tuple[int, ...]) -> tuple[Tensor, w.Q4Blocks | None]:
        """A tensor's float32 values, and its 4-bit blocks when the plan's 4-bit format can use the file's own."""
        nonlocal done
        full = f"{name}.weight"
        blocks = None
        if plan.uses(w.WeightFormat.INT4):
            raw = gguf.q4_blocks(full)
            if raw is not None:
                blocks = w.Q4Blocks(*(torch.from_numpy(a) for a in raw))
        dense = torch.from_numpy(gguf.dequantize(full)) if blocks is None else blocks.dequantize()
        if tuple(dense.shape) != shape:
            raise ModelFileError(gguf.path, f"tensor {full!r} has shape {tuple(dense.shape)}, expected {shape}")
        done += 1
        if on_tensor is not None:
            on_tensor(done, total, full)
        return dense, blocks

    def vector(name: str, size: int) -> Tensor:
        return source(name, (size,))[0]  # float32; the model keeps norms in its stream's dtype

    def projection(names: tuple[str, ...], shapes: list[tuple[int, int]]) -> w.Projection:
        parts = [source(n, s) for n, s in zip(names, shapes)]
        dense = torch.cat([d for d, _ in parts])
        blocks = (
            w.Q4Blocks.concat([b for _, b in parts if b is not None]) if all(b is not None for _, b in parts) else None
        )
        return plan.build(dense, blocks)

    c = config
    hd = c.head_dim
    blocks = []
    for i in range(c.n_layers):
        p = f"blk.{i}."
        blocks.append(
            BlockWeights(
                attn_norm=vector(p + "attn_norm", c.dim),
                attn_qkv=projection(
                    tuple(p + n for n in ATTN_QKV),
                    [(c.n_heads * hd, c.dim), (c.n_kv_heads * hd, c.dim), (c.n_kv_heads * hd, c.dim)],
                ),
                attn_output=projection((p + "attn_output",), [(c.dim, c.n_heads * hd)]),
                ffn_norm=vector(p + "ffn_norm", c.dim),
                ffn_gate_up=projection(tuple(p + n for n in FFN_GATE_UP), [(c.ffn_dim, c.dim), (c.ffn_dim, c.dim)]),
                ffn_down=projection((p + "ffn_down",), [(c.dim, c.ffn_dim)]),
            )
        )

    def head(name: str) -> w.Projection:
        q8 = gguf.q8_blocks(f"{name}.weight") if plan.decode.quantized else None
        return plan.build_head(
            source(name, (c.vocab_size, c.dim))[0],
            None if q8 is None else (torch.from_numpy(q8[0]), torch.from_numpy(q8[1])),
        )

    token_embd = head("token_embd")
    output = head("output") if gguf.has_tensor("output.weight") else token_embd
    return ModelWeights(token_embd, blocks, vector("output_norm", c.dim), output, plan)
