"""The prefix cache: whole blocks found only under their whole prefix, bounded bytes, least recently used out first."""

from __future__ import annotations

import torch

from inference.config import ModelConfig
from inference.kv_cache import SlotCache
from inference.prefix_cache import PrefixCache

CONFIG = ModelConfig(
    architecture="llama",
    dim=8,
    n_layers=2,
    n_heads=2,
    n_kv_heads=1,
    ffn_dim=16,
    context_length=256,
    rope_base=10000.0,
    rope_dim=4,
    norm_eps=1e-5,
    vocab_size=300,
)


def _cache_with(ids: list[int]) -> SlotCache:
    """A one-slot cache whose keys at position p hold the token id there, so copies can be checked."""
    cache = SlotCache(CONFIG, torch.device("cpu"), torch.float32, 1, 256)
    for p, token in enumerate(ids):
        cache.k[:, 0, :, p] = float(token)
        cache.v[:, 0, :, p] = float(-token)
    return cache


def test_a_hit_returns_the_keys_and_values_of_the_longest_cached_prefix() -> None:
    prefix = PrefixCache(max_bytes=1 << 20, block_size=4)
    ids = list(range(10, 22))  # three blocks
    prefix.insert(ids, _cache_with(ids), 0, len(ids))
    hit = prefix.lookup(ids[:10] + [99, 98], limit=11)
    assert hit.tokens == 8 and hit.k is not None and hit.v is not None
    assert hit.k[0, 0, :, 0].tolist() == [float(t) for t in ids[:8]] and hit.v[1, 0, 3, 0] == -13.0
    assert (prefix.queried_tokens, prefix.hit_tokens) == (12, 8)


def test_the_same_block_after_a_different_prefix_is_a_miss() -> None:
    prefix = PrefixCache(max_bytes=1 << 20, block_size=4)
    ids = [1, 2, 3, 4, 5, 6, 7, 8]
    prefix.insert(ids, _cache_with(ids), 0, 8)
    assert prefix.lookup([9, 9, 9, 9, 5, 6, 7, 8, 0], limit=8).tokens == 0
    assert prefix.lookup(ids + [0], limit=8).tokens == 8
    assert prefix.lookup(ids, limit=7).tokens == 4  # never the whole limit: only whole blocks within it


def test_memory_is_bounded_and_the_least_recently_used_prefix_goes_first() -> None:
    one_block = 2 * CONFIG.n_layers * CONFIG.n_kv_heads * 4 * CONFIG.head_dim * 4
    prefix = PrefixCache(max_bytes=4 * one_block, block_size=4)
    a, b, c = [1] * 4 + [2] * 4, [3] * 4 + [4] * 4, [5] * 4 + [6] * 4
    prefix.insert(a, _cache_with(a), 0, 8)
    prefix.insert(b, _cache_with(b), 0, 8)
    prefix.lookup(a + [0], limit=8)  # a is now the most recently used
    prefix.insert(c, _cache_with(c), 0, 8)
    assert prefix.nbytes <= 4 * one_block and len(prefix) == 4
    assert prefix.lookup(a + [0], limit=8).tokens == 8
    assert prefix.lookup(c + [0], limit=8).tokens == 8
    assert prefix.lookup(b + [0], limit=8).tokens == 0


def test_inserting_a_known_prefix_adds_only_its_new_blocks() -> None:
    prefix = PrefixCache(max_bytes=1 << 20, block_size=4)
    ids = list(range(20))
    prefix.insert(ids, _cache_with(ids), 0, 8)
    prefix.insert(ids, _cache_with(ids), 0, 16)
    assert len(prefix) == 4 and prefix.lookup(ids, limit=19).tokens == 16


def test_a_zero_budget_turns_it_off() -> None:
    prefix = PrefixCache(max_bytes=0, block_size=4)
    prefix.insert([1, 2, 3, 4], _cache_with([1, 2, 3, 4]), 0, 4)
    assert len(prefix) == 0 and prefix.lookup([1, 2, 3, 4, 5], limit=4).tokens == 0


def test_an_evicted_blocks_place_in_the_pool_is_reused() -> None:
    one_block = 2 * CONFIG.n_layers * CONFIG.n_kv_heads * 4 * CONFIG.head_dim * 4
    prefix = PrefixCache(max_bytes=2 * one_block, block_size=4)
    for first in range(10):
        ids = [first] * 4 + [first + 100] * 4
        prefix.insert(ids, _cache_with(ids), 0, 8)
        hit = prefix.lookup(ids + [0], limit=8)
        assert hit.tokens == 8 and hit.k is not None and hit.k[0, 0, :, 0].tolist() == [float(t) for t in ids]
    assert len(prefix) == 2 and prefix.nbytes == 2 * one_block
