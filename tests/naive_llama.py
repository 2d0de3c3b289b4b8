"""An independent, deliberately plain LLaMA forward pass for checking the real one.

float64 numpy, no cache, no batching, explicit loops over positions and heads,
RoPE written out with cos/sin on adjacent pairs. Slow and obvious on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _rope(vec: np.ndarray, position: int, base: float) -> np.ndarray:
    out = vec.copy()
    d = vec.shape[0]
    for i in range(d // 2):
        angle = position / base ** (2 * i / d)
        a, b = vec[2 * i], vec[2 * i + 1]
        out[2 * i] = a * np.cos(angle) - b * np.sin(angle)
        out[2 * i + 1] = a * np.sin(angle) + b * np.cos(angle)
    return out


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
    feed-forward's silu(gate) and up vectors."""

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
    hd, group = config.head_dim, config.n_heads // config.n_kv_heads

    def f64(name: str) -> np.ndarray:
        """A weight in float64, made when it is used (all of them at once would be a gigabyte of fresh pages)."""
        return weights[name].astype(np.float64)

    def stored(x: np.ndarray) -> np.ndarray:
        return x if kv_dtype is None else x.astype(kv_dtype).astype(np.float64)

    last = len(ids) - 1
    last_attention = np.zeros((config.n_layers, config.n_heads, len(ids)))
    embeddings = weights["token_embd.weight"]
    xs = [embeddings[i].astype(np.float64) for i in ids]  # every position, layer by layer: each attends to its prefix
    for layer in range(config.n_layers):
        p = f"blk.{layer}."
        w = {name.removeprefix(p): f64(name) for name in weights if name.startswith(p)}  # this layer's, in float64
        normed = [rms_norm(x, w["attn_norm.weight"], config.norm_eps) for x in xs]
        qs = [w["attn_q.weight"] @ x for x in normed]
        ks = [w["attn_k.weight"] @ x for x in normed]
        vs = [w["attn_v.weight"] @ x for x in normed]
        new_xs = []
        for pos, x in enumerate(xs):
            heads = []
            for h in range(config.n_heads):
                kv = h // group
                q = _rope(qs[pos][h * hd : (h + 1) * hd], pos, config.rope_base)
                scores = np.array(
                    [
                        q @ stored(_rope(ks[s][kv * hd : (kv + 1) * hd], s, config.rope_base)) / np.sqrt(hd)
                        for s in range(pos + 1)
                    ]
                )
                probs = np.exp(scores - scores.max())
                probs /= probs.sum()
                if pos == last:
                    last_attention[layer, h] = probs
                heads.append(sum(probs[s] * stored(vs[s][kv * hd : (kv + 1) * hd]) for s in range(pos + 1)))
            h1 = x + w["attn_output.weight"] @ np.concatenate(heads)
            f = rms_norm(h1, w["ffn_norm.weight"], config.norm_eps)
            gate = w["ffn_gate.weight"] @ f
            silu, up = gate / (1 + np.exp(-gate)), w["ffn_up.weight"] @ f
            new_xs.append(h1 + w["ffn_down.weight"] @ (silu * up))
            if layers is not None and pos == last:
                layers.append(NaiveLayer(x, h1, new_xs[-1], silu, up))
        xs = new_xs
    normed = np.stack([rms_norm(x, f64("output_norm.weight"), config.norm_eps) for x in xs])  # [T, dim]
    out_w = f64("output.weight" if "output.weight" in weights else "token_embd.weight")  # [V, dim]
    logits = list(normed @ out_w.T)
    return np.stack(logits), last_attention
