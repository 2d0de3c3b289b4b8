"""An independent, deliberately plain forward pass of every family we run, for checking the real one.

float64 numpy, no cache, no batching, explicit loops over positions and heads, RoPE written out with cos/sin on the
pairs the family turns (adjacent ones for llama's permuted files, the two halves of a head for NeoX ones, straight
from the file's own Q and K: no row reordering as the model does), the window of a sliding-window layer, the biases,
QK-norms, post-norms and activation the family has. Slow and obvious on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from inference.config import ModelConfig
from inference.gguf_file import GGUFFile
from inference.loader import LoadedModel
from inference.model_weights import expected_tensors


def file_weights(loaded: LoadedModel) -> dict[str, np.ndarray]:
    """The file's own weights by checkpoint name, dequantized by the gguf package: independent of how the model stores
    them."""
    gguf = GGUFFile(loaded.path)
    return {name: gguf.dequantize(name) for name in expected_tensors(loaded.config, gguf)}


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x) + eps) * weight


def _rope(
    vec: np.ndarray,
    position: float,
    base: float,
    halves: bool = False,
    rope_dim: int | None = None,
    factors: np.ndarray | None = None,
) -> np.ndarray:
    """Turn the first `rope_dim` features in pairs: (2i, 2i + 1), or with `halves` (NeoX) (i, i + rope_dim / 2), by
    position / base^(2i / rope_dim) / factors[i]."""
    out = vec.copy()
    d = rope_dim or vec.shape[0]
    for i in range(d // 2):
        angle = position / base ** (2 * i / d) / (1.0 if factors is None else float(factors[i]))
        first, second = (i, i + d // 2) if halves else (2 * i, 2 * i + 1)
        a, b = vec[first], vec[second]
        out[first] = a * np.cos(angle) - b * np.sin(angle)
        out[second] = a * np.sin(angle) + b * np.cos(angle)
    return out


def _gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (Gemma's `gelu_pytorch_tanh`), looked up as ggml does: float16 in, float16 out, 0
    below -10 and x above 10."""
    x16 = x.astype(np.float16).astype(np.float64)
    table = (0.5 * x16 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x16 + 0.044715 * x16**3)))).astype(np.float16)
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, table.astype(np.float64)))


def kv_rounding(loaded: LoadedModel) -> type[np.floating] | None:
    """The precision the model's KV cache stores keys and values in, when it is less than float32's."""
    return np.float16 if loaded.model.cache_dtype == torch.float16 else None


def naive_logits(
    config: ModelConfig, weights: dict[str, np.ndarray], ids: list[int], kv_dtype: type[np.floating] | None = None
) -> np.ndarray:
    """Logits [T, V] for every position of `ids`, each position attending over its own prefix; keys (after RoPE) and
    values rounded to `kv_dtype` as a cache of that precision stores them."""
    return naive_forward(config, weights, ids, kv_dtype=kv_dtype)[0]


@dataclass
class NaiveLayer:
    """One layer for the last token: the residual stream entering it, between its halves and leaving it, and its
    feed-forward's opened gate (silu or gelu of the gate projection) and up vectors."""

    entering: np.ndarray
    middle: np.ndarray
    leaving: np.ndarray
    gate: np.ndarray
    up: np.ndarray


def naive_forward(
    config: ModelConfig,
    weights: dict[str, np.ndarray],
    ids: list[int],
    layers: list[NaiveLayer] | None = None,
    kv_dtype: type[np.floating] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(logits [T, V], the last token's attention probabilities [layers, heads, T]); `layers`, when given, receives
    the last token's `NaiveLayer` for every layer."""
    hd, group, family = config.head_dim, config.n_heads // config.n_kv_heads, config.family

    def f64(name: str) -> np.ndarray:
        """A weight in float64, made when it is used (all of them at once would be a gigabyte of fresh pages)."""
        return weights[name].astype(np.float64)

    def stored(x: np.ndarray) -> np.ndarray:
        return x if kv_dtype is None else x.astype(kv_dtype).astype(np.float64)

    last = len(ids) - 1
    last_attention = np.zeros((config.n_layers, config.n_heads, len(ids)))
    embeddings = weights["token_embd.weight"]
    scale = np.sqrt(config.dim) if family.scale_embedding else 1.0
    factors = weights.get("rope_freqs.weight")
    # every position, layer by layer: each attends to its prefix
    xs = [embeddings[i].astype(np.float64) * scale for i in ids]
    for layer in range(config.n_layers):
        p = f"blk.{layer}."
        w = {name.removeprefix(p): f64(name) for name in weights if name.startswith(p)}  # this layer's, in float64
        window = config.window(layer)
        base = config.rope_base_for(layer)
        pos_scale = 1.0 if window else config.rope_scale

        def norm(x: np.ndarray, name: str, w: dict[str, np.ndarray] = w) -> np.ndarray:
            return rms_norm(x, w[name], config.norm_eps) if name in w else x

        def project(name: str, x: np.ndarray, w: dict[str, np.ndarray] = w) -> np.ndarray:
            y = w[f"{name}.weight"] @ x
            return y + w[f"{name}.bias"] if f"{name}.bias" in w else y

        # this layer's RoPE: its base, its position scale and (global layers) Llama 3's divisors
        turn = (base, pos_scale, None if window else factors)

        def roped(vec: np.ndarray, pos: int, norm_name: str, turn: tuple[Any, ...] = turn) -> np.ndarray:
            heads = [norm(vec[h * hd : (h + 1) * hd], norm_name) for h in range(len(vec) // hd)]
            layer_base, scale, divisors = turn
            turned = [_rope(x, pos * scale, layer_base, family.rope_halves, config.rope_dim, divisors) for x in heads]
            return np.concatenate(turned)

        normed = [norm(x, "attn_norm.weight") for x in xs]
        qs = [roped(project("attn_q", x), pos, "attn_q_norm.weight") for pos, x in enumerate(normed)]
        ks = [stored(roped(project("attn_k", x), pos, "attn_k_norm.weight")) for pos, x in enumerate(normed)]
        vs = [stored(project("attn_v", x)) for x in normed]
        new_xs = []
        for pos, x in enumerate(xs):
            first = max(0, pos + 1 - window) if window else 0
            heads = []
            for h in range(config.n_heads):
                kv = h // group
                q = qs[pos][h * hd : (h + 1) * hd]
                scores = np.array([q @ ks[s][kv * hd : (kv + 1) * hd] / np.sqrt(hd) for s in range(first, pos + 1)])
                probs = np.exp(scores - scores.max())
                probs /= probs.sum()
                if pos == last:
                    last_attention[layer, h, first : pos + 1] = probs
                heads.append(sum(p_ * vs[s][kv * hd : (kv + 1) * hd] for p_, s in zip(probs, range(first, pos + 1))))
            h1 = x + norm(w["attn_output.weight"] @ np.concatenate(heads), "post_attention_norm.weight")
            f = norm(h1, "ffn_norm.weight")
            gate = w["ffn_gate.weight"] @ f
            opened = _gelu(gate) if family.activation == "gelu" else gate / (1 + np.exp(-gate))
            up = w["ffn_up.weight"] @ f
            new_xs.append(h1 + norm(w["ffn_down.weight"] @ (opened * up), "post_ffw_norm.weight"))
            if layers is not None and pos == last:
                layers.append(NaiveLayer(x, h1, new_xs[-1], opened, up))
        xs = new_xs
    normed = np.stack([rms_norm(x, f64("output_norm.weight"), config.norm_eps) for x in xs])  # [T, dim]
    out_w = f64("output.weight" if "output.weight" in weights else "token_embd.weight")  # [V, dim]
    logits = list(normed @ out_w.T)
    return np.stack(logits), last_attention
