"""The transformer of every family we run (see `inference.config`), top-down, with module names that match the GGUF
tensor names.

`Transformer.forward` takes the tokens of a whole engine step flattened into `[N]` —
a decode token for each running sequence and chunks of prompt for newcomers — with a
`BatchPlan` saying which sequence, cache slot and position each token is, and a
`SlotCache` holding every sequence's keys and values. Projections and the feed-forward
run on all N tokens at once; attention runs per group of the plan. `ForwardProbe`s, when
given, watch single tokens for the trace's `full` level; without them the forward does
no extra work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference import cpu_kernels
from inference.batch import AttentionGroup, BatchPlan, Chunk
from inference.config import ModelConfig
from inference.kv_cache import SlotCache
from inference.model_weights import BlockWeights, ModelWeights


class ForwardProbe(Protocol):
    """Watches one token of a forward pass (see `inference.probe`)."""

    def on_residual(self, layer: int, h: Tensor) -> None:
        """The residual stream [dim] entering `layer` (and, with layer == n_layers, leaving the last one)."""

    def on_attention(self, layer: int, q: Tensor, k: Tensor, first: int) -> None:
        """The token's queries [H, hd] and the keys of positions 0..S-1 [KV, S, hd]; it sees positions first..S-1 (a
        sliding-window layer's `first` is above 0 once the sequence outgrows the window)."""

    def on_mid_residual(self, layer: int, h: Tensor) -> None:
        """The residual stream [dim] between `layer`'s two halves: after its attention update, before its
        feed-forward."""

    def on_feed_forward(self, layer: int, gate: Tensor, up: Tensor) -> None:
        """The token's opened gate (the activation of its gate projection: silu, or Gemma's gelu) and up projection
        [ffn] each; their product reaches the down projection."""

    def lens_streams(self) -> Tensor | None:
        """Recorded residual streams [n, dim] to read through the final norm and head (the logit lens), in the same
        multiply as the step's own logits; None for none."""

    def on_lens(self, logits: Tensor) -> None:
        """The lens: float32 logits [n, V] of `lens_streams`, in their order."""


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / rms(x) * weight: one pass per row through our CPU kernel when it is loaded (torch's runs six ops), else
    torch's (which accumulates in float32 for bfloat16 inputs)."""
    if (
        x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.device.type == "cpu"
        and cpu_kernels.is_loaded()
    ):
        return cpu_kernels.rms_norm(x, weight, eps)
    return F.rms_norm(x, weight.shape, weight, eps)


def rope_frequencies(
    config: ModelConfig,
    base: float,
    scale: float = 1.0,
    factors: Tensor | None = None,
    device: torch.device | None = None,
) -> Tensor:
    """Complex rotations [context_length, rope_dim / 2] for every position: angle = position * scale / base^(2i / d)
    / factors[i] (`scale`: linear RoPE scaling; `factors`: Llama 3.x's `rope_freqs`), as ggml's RoPE computes it."""
    half = config.rope_dim // 2
    inv_freq = 1.0 / (base ** (torch.arange(0, half, dtype=torch.float64, device=device) * 2 / config.rope_dim))
    if factors is not None:
        inv_freq = inv_freq / factors.to(torch.float64)
    positions = torch.arange(config.context_length, dtype=torch.float64, device=device) * scale
    angles = torch.outer(positions, inv_freq)  # [context, rope_dim / 2]
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)


def apply_rope(x: Tensor, freqs: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]): llama.cpp's converter permuted Q and K for this layout.

    x: [N, H, hd]; freqs: [N, rope_dim / 2]. The result is in `dtype` (default: x's).
    """
    dtype = dtype or x.dtype
    rot = freqs.shape[-1] * 2
    pairs = x[..., :rot].float().reshape(*x.shape[:-1], -1, 2)  # [N, H, rot/2, 2]
    rotated = torch.view_as_complex(pairs) * freqs[:, None, :]  # [N, H, rot/2]
    out = torch.view_as_real(rotated).flatten(-2)  # [N, H, rot]
    if rot == x.shape[-1]:
        return out.to(dtype)
    return torch.cat([out.to(dtype), x[..., rot:].to(dtype)], dim=-1)


def gelu(x: Tensor) -> Tensor:
    """GELU (tanh approximation) as llama.cpp computes it on a CPU: ggml looks it up in a table of float16 results
    indexed by the float16 input (`GGML_GELU_FP16`), 0 below -10 and x above 10. Computed exactly instead, Gemma 3
    270M's greedy text left llama.cpp's at a near-tie in 4 of the 6 reference prompts; rounded as ggml rounds, in 1."""
    x = x.float()
    table = F.gelu(x.half().float(), approximate="tanh").half().float()
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, table))


REFINE_MARGIN = 4.0  # tokens within this many logits of the best are recomputed in float32 by a bfloat16 head
Probes = dict[int, ForwardProbe]  # token index in the flattened batch -> its probe


def _optional(weight: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    return None if weight is None else weight.to(dtype)


class Block(nn.Module):
    """One transformer layer; attribute names are the GGUF's `blk.N.*` tensor names (Q, K, V and gate, up fused).
    What the family has (biases, QK-norm, norms after each sublayer, a sliding window) is a buffer or not."""

    attn_norm: Tensor
    ffn_norm: Tensor
    attn_qkv_bias: Tensor | None
    attn_q_norm: Tensor | None
    attn_k_norm: Tensor | None
    post_attention_norm: Tensor | None
    post_ffw_norm: Tensor | None

    def __init__(self, config: ModelConfig, weights: BlockWeights, stream_dtype: torch.dtype, layer: int) -> None:
        super().__init__()
        self.config = config
        self.stream_dtype = stream_dtype
        self.window = config.window(layer)  # positions this layer sees (0: all)
        self.register_buffer("attn_norm", weights.attn_norm.to(stream_dtype))
        self.attn_qkv = weights.attn_qkv  # [(H + 2 KV) * hd, dim]
        self.register_buffer("attn_qkv_bias", _optional(weights.attn_qkv_bias, torch.float32))
        self.register_buffer("attn_q_norm", _optional(weights.attn_q_norm, torch.float32))
        self.register_buffer("attn_k_norm", _optional(weights.attn_k_norm, torch.float32))
        self.attn_output = weights.attn_output
        self.register_buffer("post_attention_norm", _optional(weights.post_attention_norm, stream_dtype))
        self.register_buffer("ffn_norm", weights.ffn_norm.to(stream_dtype))
        self.ffn_gate_up = weights.ffn_gate_up  # [2 * ffn, dim]
        self.ffn_down = weights.ffn_down
        self.register_buffer("post_ffw_norm", _optional(weights.post_ffw_norm, stream_dtype))

    def forward(self, x: Tensor, plan: BatchPlan, cache: SlotCache, layer: int, probes: Probes) -> Tensor:
        h = x + self._post_norm(self.attention(self._norm(x, self.attn_norm), plan, cache, layer, probes), "attention")
        for token, probe in probes.items():
            probe.on_mid_residual(layer, h[token])
        return h + self._post_norm(self.feed_forward(self._norm(h, self.ffn_norm), layer, probes), "ffw")

    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        return rms_norm(x.to(self.stream_dtype), weight, self.config.norm_eps)

    def _post_norm(self, update: Tensor, sublayer: str) -> Tensor:
        """A sublayer's update as it joins the residual stream: normed again in Gemma 3 (its post-norms)."""
        weight = self.post_attention_norm if sublayer == "attention" else self.post_ffw_norm
        return update if weight is None else self._norm(update, weight)

    def qkv(self, x: Tensor) -> Tensor:
        """Queries, keys and values [N, (H + 2 KV) * hd] before RoPE: projected, biased (Qwen 2), their query and key
        heads each RMS-normed (QK-norm: Qwen 3, Gemma 3)."""
        c = self.config
        qkv = self.attn_qkv(x)
        if self.attn_qkv_bias is None and self.attn_q_norm is None:
            return qkv
        qkv = qkv.float()
        if self.attn_qkv_bias is not None:
            qkv = qkv + self.attn_qkv_bias
        if self.attn_q_norm is not None and self.attn_k_norm is not None:
            heads = qkv.view(-1, c.n_heads + 2 * c.n_kv_heads, c.head_dim)  # [N, H + 2 KV, hd]
            q = rms_norm(heads[:, : c.n_heads].reshape(-1, c.head_dim), self.attn_q_norm, c.norm_eps)  # [N H, hd]
            k = rms_norm(
                heads[:, c.n_heads : c.n_heads + c.n_kv_heads].reshape(-1, c.head_dim), self.attn_k_norm, c.norm_eps
            )  # [N KV, hd]
            n = heads.shape[0]
            qkv = torch.cat([q.view(n, -1), k.view(n, -1), heads[:, c.n_heads + c.n_kv_heads :].reshape(n, -1)], 1)
        return qkv

    def attention(self, x: Tensor, plan: BatchPlan, cache: SlotCache, layer: int, probes: Probes) -> Tensor:
        """Grouped-query attention over the cache: 9 query heads share 3 key/value heads in SmolLM2; a local layer
        (Gemma 3) sees only the last `window` positions, with RoPE of its own base."""
        c = self.config
        N = x.shape[0]
        freqs, rotations = plan.rope(local=self.window > 0)
        if rotations is not None and plan.decode is not None and not probes:
            # every token by the decode kernel: rotate, store, attend
            keys, values = cache.layer(layer)
            # [N, H * hd]
            out = cpu_kernels.roped_decode_attention(
                self.qkv(x).float(),
                rotations,
                keys,
                values,
                plan.decode.slots,
                plan.decode.lengths,
                c.n_heads,
                c.attention_scale,
                self.window,
            )
            return self.attn_output(out)
        qkv = self.qkv(x).view(N, c.n_heads + 2 * c.n_kv_heads, c.head_dim)  # [N, H + 2 KV, hd]
        # [N, H + KV, hd]: one rotation for both
        qk = apply_rope(qkv[:, : c.n_heads + c.n_kv_heads], freqs, self.stream_dtype)
        q, k = qk[:, : c.n_heads], qk[:, c.n_heads :]  # [N, H | KV, hd]
        v = qkv[:, c.n_heads + c.n_kv_heads :].to(self.stream_dtype)  # [N, KV, hd]
        cache.write(layer, plan, k, v)
        for token, probe in probes.items():
            position = int(plan.token_positions[token])
            keys, _ = cache.view(layer, int(plan.token_slots[token]), int(plan.token_slots[token]) + 1, position + 1)
            first = max(0, position + 1 - self.window) if self.window else 0
            probe.on_attention(layer, q[token], keys[0].to(q.dtype), first)
        if plan.decode is not None:  # every token by the decode kernel, each over its own positions
            keys, values = cache.layer(layer)  # [slots, KV, capacity, hd] each
            # [N, H, hd]
            out = cpu_kernels.decode_attention(
                q, keys, values, plan.decode.slots, plan.decode.lengths, c.attention_scale, self.window
            )
        else:
            out = q.new_empty(N, c.n_heads, c.head_dim)  # [N, H, hd]
            for group in plan.local_groups if self.window else plan.groups:
                _attend_group(q, cache, layer, group, out, c.kv_group_size, c.attention_scale)
        return self.attn_output(out.reshape(N, c.q_dim))  # [N, dim]

    def feed_forward(self, x: Tensor, layer: int, probes: Probes) -> Tensor:
        """A gated feed-forward: down(act(gate(x)) * up(x)), with act silu (SwiGLU, its product taken by the down
        projection, fused where it can be) or `gelu` (Gemma's GeGLU)."""
        gate_up = self.ffn_gate_up(x)  # [N, 2 ffn]: gate, then up
        uses_gelu = self.config.family.activation == "gelu"
        for token, probe in probes.items():
            gate, up = gate_up[token].float().chunk(2, dim=-1)  # [ffn] each
            probe.on_feed_forward(layer, gelu(gate) if uses_gelu else F.silu(gate), up)
        if not uses_gelu:
            return self.ffn_down.swiglu(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)  # [N, ffn] each
        return self.ffn_down(gelu(gate) * up.float())


def _attend_group(
    q: Tensor, cache: SlotCache, layer: int, g: AttentionGroup, out: Tensor, group_size: int, scale: float
) -> None:
    """One attention call for a group of the plan; writes its queries' outputs into `out` [N, H, hd]."""
    keys, values = cache.view(layer, g.lo, g.hi, g.kv_len)  # [b, KV, S, hd]
    keys, values = keys.to(q.dtype), values.to(q.dtype)  # a float16 cache is read in the queries' float32
    b, t = g.q_index.shape
    n_kv, hd = keys.shape[1], keys.shape[3]
    qg = q[: b * t].view(b, t, *q.shape[1:]) if g.in_order else q[g.q_index]  # [b, t, H, hd]
    if t == 1:
        # Decode rows: fold each KV head's query heads into rows, so every cached key is read once.
        folded = qg.view(b, n_kv, group_size, hd)  # [b, KV, group, hd]
        # [b, H, hd]
        y = F.scaled_dot_product_attention(folded, keys, values, attn_mask=g.mask, scale=scale).view(
            b, n_kv * group_size, hd
        )
    else:
        # [b, H, t, hd]
        y = F.scaled_dot_product_attention(
            qg.transpose(1, 2), keys, values, attn_mask=g.mask, is_causal=g.mask is None, enable_gqa=True, scale=scale
        )
        y = y.transpose(1, 2).reshape(b * t, n_kv * group_size, hd)  # [b * t, H, hd]
    if g.in_order:
        out[: b * t] = y
    elif g.dst is not None:
        out[g.dst] = y
    else:
        assert g.keep is not None and g.dst_index is not None
        out[g.dst_index] = y[g.keep]


class Transformer(nn.Module):
    """`stream_dtype` is what the residual stream, norms, attention and KV cache use: float32 on a CPU (the
    projections multiply in their format's dtype and hand back float32), bfloat16 on a GPU."""

    output_norm: Tensor

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        stream_dtype: torch.dtype = torch.float32,
        kv_cache_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.stream_dtype = stream_dtype
        self.kv_cache_dtype = kv_cache_dtype  # None: chosen by `cache_dtype`
        self.weights_plan = weights.plan
        self.weights_bytes = weights.nbytes
        self.token_embd = weights.token_embd  # [V, dim], looked up by rows
        self.blk = nn.ModuleList(Block(config, b, stream_dtype, i) for i, b in enumerate(weights.blocks))
        self.register_buffer("output_norm", weights.output_norm.to(stream_dtype))
        self.output = weights.output  # [V, dim]
        # Plain attributes, not buffers: Module.to(dtype) would cast the complex rotations to real.
        self.freqs_cis = rope_frequencies(config, config.rope_base, config.rope_scale, weights.rope_freqs)
        self.local_freqs = (
            rope_frequencies(config, config.local_rope_base)
            if config.has_local_layers and config.local_rope_base
            else None
        )
        self.window = max((config.window(i) for i in range(config.n_layers)), default=0)  # local layers' (0: none)

    @property
    def dtype(self) -> torch.dtype:
        """The residual stream's dtype."""
        return self.stream_dtype

    @property
    def cache_dtype(self) -> torch.dtype:
        """The KV cache's: as set (`ROUNDTRIP_KV_CACHE`), else float16 where the decode kernel reads it, as llama.cpp
        keeps its cache by default.

        A decode step reads every running sequence's whole cache in every layer; on 2 CPU cores, at 8 sequences of 150
        positions, that read (float32) was a quarter of the step. Keys and values are rounded once, when stored, and
        every
        attention reads them back from the cache, so a token's result does not depend on how it was batched or chunked.
        Elsewhere (a GPU in bfloat16, torch's own attention) the cache keeps the stream's dtype."""
        if self.kv_cache_dtype is not None:
            return self.kv_cache_dtype
        return torch.float16 if self.decode_kernel else self.stream_dtype

    @property
    def device(self) -> torch.device:
        return self.output_norm.device

    def new_cache(self, slots: int, capacity: int) -> SlotCache:
        return SlotCache(self.config, self.device, self.cache_dtype, slots, min(capacity, self.config.context_length))

    def forward(
        self,
        tokens: Tensor,
        plan: BatchPlan,
        cache: SlotCache,
        probes: Probes | None = None,
        logits_for: Tensor | None = None,
    ) -> Tensor:
        """tokens [N] laid out by `plan`. Returns float32 logits [n, V] for the tokens `logits_for`
        (default: the last token of every chunk)."""
        probes = probes or {}
        x = self.token_embd.rows(tokens)  # [N, dim]
        if self.config.embedding_scale != 1.0:
            x = x * self.config.embedding_scale
        x = x.to(self.stream_dtype)
        for layer, block in enumerate(self.blk):
            for token, probe in probes.items():
                probe.on_residual(layer, x[token])
            x = block(x, plan, cache, layer, probes)
        for token, probe in probes.items():
            probe.on_residual(self.config.n_layers, x[token])
        rows = plan.last_tokens if logits_for is None else logits_for
        n = int(rows.shape[0])
        lens = [(probe, streams) for probe in probes.values() if (streams := probe.lens_streams()) is not None]
        if not lens:
            return self.logits(x[rows])  # [n, V]
        # One pass through the 49k-row head for the step's rows and every probe's lens rows: a batch of a dozen
        # rows costs little more than one. The lens rows are refined like the step's: its last layer is the model's
        # own prediction, and a compact head's rounding would otherwise show another probability for it than the
        # sampler's (95.4 % against 71.3 % for <|im_end|> after "New Delhi." in int8).
        logits = self.logits(torch.cat([x[rows].to(self.dtype), *(streams.to(self.dtype) for _, streams in lens)]))
        offset = n
        for probe, streams in lens:
            probe.on_lens(logits[offset : offset + streams.shape[0]])
            offset += streams.shape[0]
        return logits[:n]

    def logits(self, h: Tensor) -> Tensor:
        """float32 logits [n, V] from residual streams h [n, dim] (the last layer's, or any layer's for the logit lens).

        A head that multiplies in bfloat16 rounds its outputs to 8 significant bits (steps of 0.125 at
        logit 20), which makes false ties between the likeliest tokens; their logits are recomputed
        in float32 from the head's own rows, so the choice and the top probabilities are exact.
        """
        normed = rms_norm(h.to(self.dtype), self.output_norm, self.config.norm_eps)  # [n, dim]
        logits = self.output(normed).float()  # [n, V]
        if self.output.format.compute_dtype == torch.float32:
            return logits
        if logits.device.type == "cpu" and cpu_kernels.is_loaded():
            row, token = cpu_kernels.near_best(logits, REFINE_MARGIN)  # [m] each
        else:
            near = logits >= logits.amax(dim=-1, keepdim=True) - REFINE_MARGIN  # [n, V]
            row, token = near.nonzero(as_tuple=True)  # [m] each
        logits[row, token] = (self.output.rows(token) * normed[row].float()).sum(dim=-1)  # [m, dim] -> [m]
        return logits

    def plan(self, chunks: Sequence[Chunk]) -> BatchPlan:
        """The layout of a forward over `chunks` (see `inference.batch`), on this model's device and dtype."""
        if self.freqs_cis.device != self.device:
            self.freqs_cis = self.freqs_cis.to(self.device)  # moved once
            self.local_freqs = None if self.local_freqs is None else self.local_freqs.to(self.device)
        # the fused call turns whole vectors of pairs (16 floats with AVX512)
        fused = self.decode_kernel and self.config.rope_dim % 16 == 0
        return BatchPlan.build(
            chunks,
            self.freqs_cis,
            self.dtype,
            decode_kernel=self.decode_kernel,
            fused_rope=fused,
            local_freqs=self.local_freqs,
            window=self.window,
        )

    @property
    def decode_kernel(self) -> bool:
        """Whether decode rows are attended by our kernel (float32 on a CPU that has it loaded)."""
        return (
            self.device.type == "cpu"
            and self.dtype == torch.float32
            and self.config.head_dim in (32, 64, 128, 256)
            and cpu_kernels.is_loaded()
        )
