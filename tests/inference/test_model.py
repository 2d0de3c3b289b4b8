"""The transformer against an independent plain re-computation, and cached decoding against uncached."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from forward import all_logits, forward
from load_settings import cpu
from naive_transformer import file_weights, kv_rounding, naive_logits

from inference.batch import BatchPlan, Chunk
from inference.loader import LoadedModel, load_model
from inference.model import Transformer, apply_rope


def _cached_logits(model: Transformer, ids: list[int], prefill: int) -> torch.Tensor:
    """Prefill the first `prefill` tokens, then feed the rest one at a time through the KV cache."""
    cache = model.new_cache(1, len(ids))
    rows = [forward(model, cache, [(Chunk(0, 0, prefill), ids[:prefill])])]
    rows += [forward(model, cache, [(Chunk(0, pos, 1), [ids[pos]])]) for pos in range(prefill, len(ids))]
    return torch.cat(rows)


def test_tiny_model_logits_match_a_plain_recomputation(tiny_model: LoadedModel) -> None:
    ids = [1, 120, 45, 200, 7, 99, 250, 3]
    expected = naive_logits(tiny_model.config, file_weights(tiny_model), ids, kv_rounding(tiny_model))
    assert np.allclose(all_logits(tiny_model.model, ids).numpy(), expected, atol=1e-4, rtol=1e-4)


def test_real_model_logits_match_a_plain_recomputation(smollm2: LoadedModel) -> None:
    ids = smollm2.tokenizer.encode("What's the capital of India?").ids
    expected = naive_logits(smollm2.config, file_weights(smollm2), ids, kv_rounding(smollm2))
    got = all_logits(smollm2.model, ids).numpy()
    # A float16 cache stores each key and value to 11 significant bits; the reference rounds its float64 values, the
    # model its float32 ones, and where the two round to neighbouring halves (a relative 5e-4) the logits move by a few
    # thousandths. A float32 cache leaves only float32's own error.
    assert np.abs(got - expected).max() < (1e-2 if kv_rounding(smollm2) else 2e-3)
    assert (got.argmax(-1) == expected.argmax(-1)).all()


SMOLLM2_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 11173, 30, 2, 198]


@pytest.mark.parametrize("model_name", ["tiny_model", "smollm2"])
def test_cached_decoding_equals_uncached(
    request: pytest.FixtureRequest, model_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a float32 cache: what is left is float32 arithmetic (a prompt's rows and a decode row multiply
    differently)."""
    loaded: LoadedModel = request.getfixturevalue(model_name)
    monkeypatch.setattr(loaded.model, "kv_cache_dtype", torch.float32)
    ids = SMOLLM2_IDS if model_name == "smollm2" else [1, 5, 80, 91, 200, 17, 3]
    full = all_logits(loaded.model, ids)
    cached = _cached_logits(loaded.model, ids, prefill=3)
    assert torch.allclose(cached, full[2:], atol=1e-4, rtol=1e-4)


def test_the_default_cache_on_a_cpu_is_float16_and_moves_logits_only_by_its_rounding(
    smollm2: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding through the float16 cache against the float32 one: the same choices, logits within a few hundredths
    (a key rounded to 11 bits moves a score by ~5e-4 of itself, and float32 differences of 1e-5 between a prompt's
    rows and a decode row can tip a key to the neighbouring half)."""
    assert smollm2.model.cache_dtype == torch.float16
    assert smollm2.model.new_cache(1, 4).k.dtype == torch.float16
    half = _cached_logits(smollm2.model, SMOLLM2_IDS, prefill=3)
    monkeypatch.setattr(smollm2.model, "kv_cache_dtype", torch.float32)
    single = _cached_logits(smollm2.model, SMOLLM2_IDS, prefill=3)
    assert (half.argmax(-1) == single.argmax(-1)).all()
    assert 0 < (half - single).abs().max() < 0.1


def test_rope_rotates_adjacent_pairs() -> None:
    x = torch.zeros(1, 1, 4)
    x[..., 0] = 1.0  # the pair (x0, x1) = (1, 0)
    angle = torch.tensor([0.5, 0.0])
    freqs = torch.polar(torch.ones(2), angle)[None]  # [1, 2]
    out = apply_rope(x, freqs)[0, 0]
    assert torch.allclose(out, torch.tensor([np.cos(0.5), np.sin(0.5), 0.0, 0.0], dtype=torch.float32), atol=1e-6)


def test_one_forward_of_decode_rows_and_a_prompt_chunk_matches_single_runs(tiny_model: LoadedModel) -> None:
    """Two decode rows at different positions and a newcomer's prompt chunk, in one forward, each get their own
    logits."""
    model = tiny_model.model
    a, b, c = [1, 40, 41, 42], [1, 90, 91], [1, 7, 8, 9, 10]
    cache = model.new_cache(3, 16)
    forward(model, cache, [(Chunk(0, 0, 4), a), (Chunk(1, 0, 3), b)])
    forward(model, cache, [(Chunk(2, 0, 2), c[:2])])
    step = forward(model, cache, [(Chunk(0, 4, 1), [43]), (Chunk(1, 3, 1), [5]), (Chunk(2, 2, 3), c[2:])])
    assert torch.allclose(step[0], all_logits(model, a + [43])[-1], atol=1e-5)
    assert torch.allclose(step[1], all_logits(model, b + [5])[-1], atol=1e-5)
    assert torch.allclose(step[2], all_logits(model, c)[-1], atol=1e-5)


def test_a_decode_row_far_longer_than_the_others_is_attended_on_its_own(
    tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("inference.batch.LONG_ROW_MIN", 16)
    model = tiny_model.model
    long, short = list(range(3, 203)), [1, 2, 3]
    plan = model.plan([Chunk(0, 200, 1), Chunk(1, 3, 1), Chunk(2, 3, 1)])
    assert [(g.lo, g.hi, g.kv_len) for g in plan.groups] == [(1, 3, 4), (0, 1, 201)]
    cache = model.new_cache(3, 256)
    forward(model, cache, [(Chunk(0, 0, 200), long), (Chunk(1, 0, 3), short)])
    forward(model, cache, [(Chunk(2, 0, 3), short)])
    step = forward(model, cache, [(Chunk(0, 200, 1), [9]), (Chunk(1, 3, 1), [5]), (Chunk(2, 3, 1), [5])])
    assert torch.allclose(step[0], all_logits(model, long + [9])[-1], atol=1e-4)
    assert torch.allclose(step[1], all_logits(model, short + [5])[-1], atol=1e-5)
    assert torch.allclose(step[2], step[1], atol=1e-6)


def test_untied_output_weights_are_used(write_gguf: Any) -> None:
    loaded = load_model(str(write_gguf(tied_embeddings=False)), cpu())
    assert loaded.model.output is not loaded.model.token_embd
    ids = [1, 30, 31]
    expected = naive_logits(loaded.config, file_weights(loaded), ids, kv_rounding(loaded))
    assert np.allclose(all_logits(loaded.model, ids).numpy(), expected, atol=1e-4, rtol=1e-4)


def test_with_the_decode_kernel_every_token_is_one_of_its_rows(tiny_model: LoadedModel) -> None:
    """Decode rows and prompt chunks of any length: each token a kernel row over its own positions, no attention
    group."""
    freqs = tiny_model.model.freqs_cis
    plan = BatchPlan.build(
        [Chunk(0, 10, 1), Chunk(1, 3, 4), Chunk(2, 0, 40)], freqs, decode_kernel=True, fused_rope=True
    )
    assert plan.decode is not None and plan.groups == () and plan.rotations is not None
    assert plan.decode.slots.tolist() == [0, 1, 1, 1, 1] + [2] * 40
    assert plan.decode.lengths.tolist() == [11, 4, 5, 6, 7] + list(range(1, 41))
    without = BatchPlan.build([Chunk(0, 10, 1), Chunk(1, 3, 4), Chunk(2, 0, 40)], freqs)
    assert without.decode is None and [(g.lo, g.hi, g.kv_len) for g in without.groups] == [
        (0, 1, 11),
        (1, 2, 7),
        (2, 3, 40),
    ]


@pytest.fixture(scope="module")
def served_smollm2() -> LoadedModel:
    """The real model as a server holds it by default here: int4 weights on our kernels (the tests' ROUNDTRIP_WEIGHTS
    is fp32, whose torch matrix multiplies round differently for different row counts)."""
    return load_model(settings=cpu(weights="int4", use_cache=True))


@pytest.mark.parametrize("cached", [0, 16, 32, 35])
def test_a_token_gets_the_same_bits_whatever_chunk_or_cache_hit_its_prompt_came_in(
    served_smollm2: LoadedModel, cached: int
) -> None:
    """A prompt prefilled whole, in chunks of 4, or after `cached` positions loaded from an earlier run (the prefix
    cache's case): the same last-token logits to the bit, so a seeded request samples the same text in each case."""
    model = served_smollm2.model
    assert model.decode_kernel, "the decode-attention kernel is not loaded"
    ids = served_smollm2.chat_template.render([{"role": "user", "content": "What's the capital of India?"}]).ids
    whole_cache = model.new_cache(1, len(ids))
    whole = forward(model, whole_cache, [(Chunk(0, 0, len(ids)), ids)])[-1]
    chunked_cache = model.new_cache(1, len(ids))
    chunked = [
        forward(model, chunked_cache, [(Chunk(0, s, len(ids[s : s + 4])), ids[s : s + 4])])
        for s in range(0, len(ids), 4)
    ][-1][-1]
    assert torch.equal(chunked, whole)
    warm_cache = model.new_cache(1, len(ids))
    k, v = whole_cache.read(0, 0, cached)
    warm_cache.load(0, 0, k, v)
    warm = forward(model, warm_cache, [(Chunk(0, cached, len(ids) - cached), ids[cached:])])[-1]
    assert torch.equal(warm, whole)


def test_a_decode_step_rotates_stores_and_attends_in_one_kernel_call_with_the_same_bits(write_gguf: Any) -> None:
    """The fused path (rope, cache write and decode attention in one call per layer) against the same step done by
    apply_rope, SlotCache.write and the decode kernel separately: same logits, same keys and values in the cache."""
    model = load_model(str(write_gguf(dim=128)), cpu()).model  # head_dim 32: the kernel's smallest
    a, b = [1, 40, 41, 42], [1, 90, 91]
    caches = [model.new_cache(2, 16) for _ in range(2)]
    for cache in caches:
        forward(model, cache, [(Chunk(0, 0, 4), a), (Chunk(1, 0, 3), b)])
    chunks = [Chunk(0, 4, 1), Chunk(1, 3, 3)]  # a decode row and a short chunk: every token by the kernel
    fused = model.plan(chunks)
    separate = BatchPlan.build(chunks, model.freqs_cis, decode_kernel=True)
    assert fused.rotations is not None and separate.rotations is None
    tokens = torch.tensor([43, 5, 6, 7])
    with torch.inference_mode():
        got = [model(tokens, plan, cache) for plan, cache in zip((fused, separate), caches)]
    assert torch.equal(got[0], got[1])
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
