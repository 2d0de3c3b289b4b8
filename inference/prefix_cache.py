"""Keys and values of recently computed token prefixes, reused instead of recomputed.

A new turn of a conversation repeats the whole earlier conversation; many requests share
a system prompt. The cache keeps what a finished (or fully prefilled) sequence computed,
in blocks of `block_size` tokens. A block is found by its tokens *and* everything before
them — its key is (the id of the block before it, its own tokens), compared exactly, so
two prefixes never collide — which makes a hit always a true prefix. Memory is bounded
in bytes; the least recently used blocks go first (a prefix's earlier blocks are touched
after its later ones, so a chain loses its tail before its head).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from inference.kv_cache import SlotCache

BlockKey = tuple[int, tuple[int, ...]]  # (id of the previous block or 0, this block's tokens)


@dataclass
class _Block:
    id: int
    k: Tensor  # [n_layers, n_kv, block_size, hd]
    v: Tensor


@dataclass(frozen=True)
class PrefixHit:
    tokens: int  # how many leading tokens are covered
    k: Tensor | None  # [n_layers, n_kv, tokens, hd], or None on a miss
    v: Tensor | None


class PrefixCache:
    def __init__(self, max_bytes: int, block_size: int = 32) -> None:
        self.max_bytes = max_bytes
        self.block_size = block_size
        self.nbytes = 0
        self._blocks: OrderedDict[BlockKey, _Block] = OrderedDict()
        self._ids = itertools.count(1)
        self.queried_tokens = 0  # totals, for metrics: prompt tokens looked up...
        self.hit_tokens = 0  # ...and found

    def __len__(self) -> int:
        return len(self._blocks)

    def _keys(self, ids: Sequence[int], limit: int) -> list[BlockKey]:
        """Keys of the known chain for ids[:limit], up to the first block not in the cache."""
        keys: list[BlockKey] = []
        parent = 0
        bs = self.block_size
        for start in range(0, limit - bs + 1, bs):
            key = (parent, tuple(ids[start : start + bs]))
            block = self._blocks.get(key)
            if block is None:
                break
            keys.append(key)
            parent = block.id
        return keys

    def lookup(self, ids: Sequence[int], limit: int) -> PrefixHit:
        """The longest cached prefix of ids[:limit] (whole blocks), its keys and values joined."""
        keys = self._keys(ids, limit)
        self.queried_tokens += len(ids)
        if not keys:
            return PrefixHit(0, None, None)
        for key in reversed(keys):  # head last: the most recently used end of the order
            self._blocks.move_to_end(key)
        blocks = [self._blocks[key] for key in keys]
        tokens = len(blocks) * self.block_size
        self.hit_tokens += tokens
        return PrefixHit(tokens, torch.cat([b.k for b in blocks], dim=2), torch.cat([b.v for b in blocks], dim=2))

    def insert(self, ids: Sequence[int], cache: SlotCache, slot: int, length: int) -> None:
        """Keep the whole blocks of ids[:length], whose keys and values are in `slot` of `cache`."""
        if self.max_bytes <= 0:
            return
        bs = self.block_size
        chain = self._keys(ids, length)
        parent = self._blocks[chain[-1]].id if chain else 0
        for start in range(len(chain) * bs, length - bs + 1, bs):
            k, v = cache.read(slot, start, start + bs)
            block = _Block(next(self._ids), k, v)
            key = (parent, tuple(ids[start : start + bs]))
            self._blocks[key] = block
            chain.append(key)
            self.nbytes += k.nbytes + v.nbytes
            parent = block.id
        for key in reversed(chain):  # head last: the most recently used end of the order
            self._blocks.move_to_end(key)
        while self.nbytes > self.max_bytes and self._blocks:
            _, evicted = self._blocks.popitem(last=False)
            self.nbytes -= evicted.k.nbytes + evicted.v.nbytes
