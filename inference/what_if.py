"""Questions the page asks the model about a step after the fact, each answered in a cache of its own.

A live trace keeps what it could afford while streaming (one attention row per pass, the detail of the token it
just fed); these recompute a prompt from scratch, so the running batch is never touched:
- `inspect`: the full-level detail (attention, norms, logit lens after every layer) of the last of `ids`;
- `prompt_attention`: one layer's attention for every prompt position (the whole token x token matrix);
- `resample`: what if a past step had been drawn with other sampling settings, on its real logits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from inference.batch import Chunk
from inference.errors import InvalidRequestError
from inference.model import ForwardProbe, Transformer
from inference.params import SamplingParams
from inference.probe import LayerProbe, PromptMatrixProbe, lens_layers
from inference.sampling import Sample, Sampler
from inference.sequence import DETAIL_TOP_N
from inference.trace import LayerDetail


@torch.inference_mode()
def inspect(model: Transformer, ids: Sequence[int]) -> LayerDetail:
    """The full-level look at the last position of `ids` (a run traced at summary level, or a token beyond the live
    position budget), with the logit lens after every layer."""
    probe = LayerProbe(lens_layers(model.config.n_layers, None))
    last_logits(model, ids, {len(ids) - 1: probe})
    return probe.detail()


@torch.inference_mode()
def prompt_attention(model: Transformer, ids: Sequence[int], layer: int) -> Tensor:
    """The prefill's full token x token attention at `layer` for `ids`: [H, T, T] (row i: position i's query)."""
    c = model.config
    if not 0 <= layer < c.n_layers:
        raise InvalidRequestError(f"'layer' must be 0 to {c.n_layers - 1}", "layer")
    probe = PromptMatrixProbe(layer, c.n_heads, len(ids))
    last_logits(model, ids, dict.fromkeys(range(len(ids)), probe))
    return probe.weights


@torch.inference_mode()
def resample(
    model: Transformer,
    stop_ids: frozenset[int],
    prompt_ids: Sequence[int],
    generated: Sequence[int],
    params: SamplingParams,
) -> Sample:
    """The next token after `prompt_ids` + `generated`, drawn with `params` (penalties see `generated` as the output
    so far) from that step's real logits; explained as the sampling stage shows a live step."""
    sampler = Sampler(params, model.config.vocab_size, prompt_ids, stop_ids)
    for token in generated:
        sampler.observe(token)
    return sampler.sample(last_logits(model, [*prompt_ids, *generated], {}), DETAIL_TOP_N)


def likeliest(model: Transformer, ids: Sequence[int], k: int) -> list[tuple[int, float]]:
    """The `k` likeliest tokens after `ids` and their probabilities, best first."""
    top = torch.topk(torch.softmax(last_logits(model, ids, {}), dim=-1), k)
    return list(zip(top.indices.tolist(), top.values.tolist()))


def last_logits(model: Transformer, ids: Sequence[int], probes: Mapping[int, ForwardProbe]) -> Tensor:
    """float32 logits [V] after `ids`, computed in a cache of their own."""
    cache = model.new_cache(1, len(ids))
    plan = model.plan([Chunk(0, 0, len(ids))])
    return model(torch.tensor(list(ids), device=model.device), plan, cache, dict(probes))[0].float().cpu()
