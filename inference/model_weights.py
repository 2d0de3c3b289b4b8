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
QK_NORMS = ("attn_q_norm", "attn_k_norm")
POST_NORMS = ("post_attention_norm", "post_ffw_norm")


@dataclass
class BlockWeights:
    attn_norm: Tensor
    attn_qkv: w.Projection
    attn_output: w.Projection
    ffn_norm: Tensor
    ffn_gate_up: w.Projection
    ffn_down: w.Projection
    attn_qkv_bias: Tensor | None = None  # [(H + 2 KV) * hd] (Qwen 2)
    attn_q_norm: Tensor | None = None  # [hd] (QK-norm: Qwen 3, Gemma 3)
    attn_k_norm: Tensor | None = None  # [hd]
    post_attention_norm: Tensor | None = None  # [dim] (Gemma 3)
    post_ffw_norm: Tensor | None = None  # [dim]

    PROJECTIONS = ("attn_qkv", "attn_output", "ffn_gate_up", "ffn_down")
    OPTIONAL = ("attn_qkv_bias", *QK_NORMS, *POST_NORMS)  # what some families have
    VECTORS = ("attn_norm", "ffn_norm", *OPTIONAL)

    def vectors(self) -> list[Tensor]:
        return [t for n in self.VECTORS if (t := getattr(self, n)) is not None]


@dataclass
class ModelWeights:
    token_embd: w.Projection  # [V, dim]: rows are looked up (the same object as `output` when tied)
    blocks: list[BlockWeights]
    output_norm: Tensor
    output: w.Projection  # [V, dim]
    plan: WeightPlan
    rope_freqs: Tensor | None = None  # [rope_dim / 2]: Llama 3.x's divisor per RoPE frequency

    @property
    def nbytes(self) -> int:
        projections = [self.output] + [getattr(b, n) for b in self.blocks for n in BlockWeights.PROJECTIONS]
        if self.token_embd is not self.output:
            projections.append(self.token_embd)
        tensors = [self.output_norm] + [t for b in self.blocks for t in b.vectors()]
        return sum(p.nbytes for p in projections) + sum(t.numel() * t.element_size() for t in tensors)

    def state(self) -> dict[str, Any]:
        """Everything as plain tensors and dicts, for `torch.save` in the weights cache."""
        return {
            "plan": self.plan.key,
            "token_embd": None if self.token_embd is self.output else self.token_embd.state(),
            "output_norm": self.output_norm,
            "output": self.output.state(),
            "rope_freqs": self.rope_freqs,
            "blocks": [
                {
                    **{n: getattr(b, n).state() for n in BlockWeights.PROJECTIONS},
                    **{n: getattr(b, n) for n in BlockWeights.VECTORS},
                }
                for b in self.blocks
            ],
        }

    @classmethod
    def restore(cls, state: dict[str, Any], plan: WeightPlan) -> ModelWeights:
        blocks = [
            BlockWeights(
                attn_norm=b["attn_norm"],
                attn_qkv=w.restore(b["attn_qkv"]),
                attn_output=w.restore(b["attn_output"]),
                ffn_norm=b["ffn_norm"],
                ffn_gate_up=w.restore(b["ffn_gate_up"]),
                ffn_down=w.restore(b["ffn_down"]),
                **{n: b[n] for n in BlockWeights.OPTIONAL},
            )
            for b in state["blocks"]
        ]
        output = w.restore(state["output"])
        token_embd = output if state["token_embd"] is None else w.restore(state["token_embd"])
        return cls(token_embd, blocks, state["output_norm"], output, plan, state["rope_freqs"])


def block_tensors(config: ModelConfig) -> tuple[str, ...]:
    """The tensors of one layer in this architecture (`blk.N.<name>.weight`; biases are `.bias`)."""
    f = config.family
    names = BLOCK_TENSORS + (QK_NORMS if f.qk_norm else ()) + (POST_NORMS if f.post_norms else ())
    return names + (tuple(f"{n}.bias" for n in ATTN_QKV) if f.qkv_bias else ())


def expected_tensors(config: ModelConfig, gguf: GGUFFile) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"]
    names += [
        f"blk.{i}.{t}" if t.endswith(".bias") else f"blk.{i}.{t}.weight"
        for i in range(config.n_layers)
        for t in block_tensors(config)
    ]
    for optional in ("output.weight", "rope_freqs.weight"):
        if gguf.has_tensor(optional):
            names.append(optional)
    return names


def rope_pairing(n_heads: int, head_dim: int, rope_dim: int) -> Tensor:
    """The row order that turns NeoX RoPE (feature i with i + rope_dim / 2) into adjacent pairs (2i with 2i + 1) for
    a projection's `n_heads` heads: the model and its kernels rotate adjacent pairs only. A query . key product is the
    same in any order of the features, so permuting Q's and K's rows (their biases and QK-norm weights alike) leaves
    attention exactly as the file's layout computes it."""
    half = rope_dim // 2
    within = torch.arange(head_dim)
    within[:rope_dim] = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()
    return (torch.arange(n_heads)[:, None] * head_dim + within[None, :]).flatten()  # [n_heads * head_dim]


def read(
    gguf: GGUFFile, config: ModelConfig, plan: WeightPlan, on_tensor: Callable[[int, int, str], None] | None = None
) -> ModelWeights:
    """Build every weight in `plan`'s formats; `on_tensor(done, total, name)` reports progress."""
    reader = WeightReader(gguf, plan, len(expected_tensors(config, gguf)), on_tensor)
    c = config
    blocks = [reader.block(f"blk.{i}.", c) for i in range(c.n_layers)]
    token_embd = reader.head("token_embd", c)
    output = reader.head("output", c) if gguf.has_tensor("output.weight") else token_embd
    rope_freqs = reader.vector("rope_freqs", c.rope_dim // 2) if gguf.has_tensor("rope_freqs.weight") else None
    return ModelWeights(token_embd, blocks, reader.vector("output_norm", c.dim), output, plan, rope_freqs)


class WeightReader:
    """Reads a file's tensors one at a time, checking each one's shape, into the plan's formats."""

    def __init__(
        self, gguf: GGUFFile, plan: WeightPlan, total: int, on_tensor: Callable[[int, int, str], None] | None
    ) -> None:
        self.gguf, self.plan, self.total, self.on_tensor = gguf, plan, total, on_tensor
        self.done = 0

    def source(self, name: str, shape: tuple[int, ...], alone: bool = False) -> tuple[Tensor, w.Blocks | None]:
        """A tensor's float32 values (`name`: without `.weight`, or ending in `.bias`), and its blocks when the plan's
        4-bit format can use the file's own (4-bit ones; with our kernels, the 5- to 8-bit ones too, as bytes, and
        Q6_K exactly for a projection of its own (`alone`: fused with others, it takes their one byte grid))."""
        full = name if name.endswith(".bias") else f"{name}.weight"
        blocks: w.Blocks | None = None
        regridded = False  # blocks that are not the file's own values (Q6_K on one byte grid)
        if self.plan.uses(w.WeightFormat.INT4):
            raw = self.gguf.q4_blocks(full)
            six = self.gguf.q6_blocks(full) if alone and self.plan.q8 and raw is None else None
            if six is not None:
                blocks = w.Q6Blocks(torch.from_numpy(six[0]), torch.from_numpy(six[1]))
            elif raw is not None:
                blocks = w.Q4Blocks(torch.from_numpy(raw[0]), torch.from_numpy(raw[1]), torch.from_numpy(raw[2]))
            elif self.plan.q8 and (wide := self.gguf.byte_blocks(full)) is not None:
                codes, scales, minimums, exact = wide
                blocks = w.Q4Blocks(
                    torch.from_numpy(codes), torch.from_numpy(scales), torch.from_numpy(minimums), bits=8
                )
                regridded = not exact
        if blocks is not None and not regridded:
            dense = blocks.dequantize()  # the file's own values, without reading the tensor again
        else:
            dense = torch.from_numpy(self.gguf.dequantize(full))
        if tuple(dense.shape) != shape:
            raise ModelFileError(self.gguf.path, f"tensor {full!r} has shape {tuple(dense.shape)}, expected {shape}")
        self.done += 1
        if self.on_tensor is not None:
            self.on_tensor(self.done, self.total, full)
        return dense, blocks

    def vector(self, name: str, size: int) -> Tensor:
        return self.source(name, (size,))[0]  # float32; the model keeps norms in its stream's dtype

    def projection(
        self, names: tuple[str, ...], shapes: list[tuple[int, int]], orders: list[Tensor | None] | None = None
    ) -> w.Projection:
        """One projection from one or more tensors stacked along the outputs (q, k and v; gate and up), each one's
        rows in `orders` (None: as stored)."""
        parts = [self.source(n, s, alone=len(names) == 1) for n, s in zip(names, shapes)]
        if orders is not None:
            parts = [(d, b) if o is None else (d[o], b and b.rows(o)) for (d, b), o in zip(parts, orders)]
        dense = torch.cat([d for d, _ in parts])  # [sum of outputs, inputs]
        if len(parts) == 1:
            return self.plan.build(dense, parts[0][1])
        found = [b for _, b in parts if isinstance(b, w.Q4Blocks)]
        return self.plan.build(dense, w.Q4Blocks.concat(found) if len(found) == len(parts) else None)

    def block(self, p: str, c: ModelConfig) -> BlockWeights:
        hd, f = c.head_dim, c.family
        q_order = rope_pairing(c.n_heads, hd, c.rope_dim) if f.rope_halves else None
        k_order = rope_pairing(c.n_kv_heads, hd, c.rope_dim) if f.rope_halves else None
        head_order = rope_pairing(1, hd, c.rope_dim) if f.rope_halves else None
        qkv_shapes = [(c.q_dim, c.dim), (c.n_kv_heads * hd, c.dim), (c.n_kv_heads * hd, c.dim)]

        def ordered(name: str, size: int, order: Tensor | None) -> Tensor:
            v = self.vector(p + name, size)
            return v if order is None else v[order]

        bias = None
        if f.qkv_bias:
            sizes = [s[0] for s in qkv_shapes]
            bias = torch.cat(
                [ordered(f"{n}.bias", size, o) for n, size, o in zip(ATTN_QKV, sizes, (q_order, k_order, None))]
            )
        return BlockWeights(
            attn_norm=self.vector(p + "attn_norm", c.dim),
            attn_qkv=self.projection(tuple(p + n for n in ATTN_QKV), qkv_shapes, [q_order, k_order, None]),
            attn_output=self.projection((p + "attn_output",), [(c.dim, c.q_dim)]),
            ffn_norm=self.vector(p + "ffn_norm", c.dim),
            ffn_gate_up=self.projection(tuple(p + n for n in FFN_GATE_UP), [(c.ffn_dim, c.dim), (c.ffn_dim, c.dim)]),
            ffn_down=self.projection((p + "ffn_down",), [(c.dim, c.ffn_dim)]),
            attn_qkv_bias=bias,
            attn_q_norm=ordered("attn_q_norm", hd, head_order) if f.qk_norm else None,
            attn_k_norm=ordered("attn_k_norm", hd, head_order) if f.qk_norm else None,
            post_attention_norm=self.vector(p + "post_attention_norm", c.dim) if f.post_norms else None,
            post_ffw_norm=self.vector(p + "post_ffw_norm", c.dim) if f.post_norms else None,
        )

    def head(self, name: str, c: ModelConfig) -> w.Projection:
        """An embedding or output head: exact 8-bit rows from the file's own Q8_0 blocks where the plan quantizes."""
        q8 = self.gguf.q8_blocks(f"{name}.weight") if self.plan.decode.quantized else None
        dense = self.source(name, (c.vocab_size, c.dim))[0]
        return self.plan.build_head(dense, None if q8 is None else (torch.from_numpy(q8[0]), torch.from_numpy(q8[1])))
