"""The shape of one batched forward: which tokens belong to which sequence, and how attention reads the cache.

A forward takes the tokens of every sequence in the step flattened into one row `[N]`:
a decode token per decoding sequence and a chunk of prompt for newcomers. Everything but
attention (embeddings, projections, norms, the feed-forward) runs on all N tokens at once.
Attention runs in a few groups, planned here once per forward and shared by every layer:

- with our decode-attention kernel loaded (`inference.cpu_kernels`), every token, decode step or
  prompt, is one of its rows, reading exactly its own sequence's keys up to its own position
  (`DecodeRows`): a token's attention is then computed the same way however its prompt was
  chunked, batched or found in the prefix cache, so a seeded request gives the same text either
  way; without the kernel, single-token chunks of ordinary length share one call over the cache
  slots they occupy, padded to the longest of them and masked;
- a single-token chunk much longer than the others gets its own call, so one long
  conversation does not make every short row read thousands of masked positions;
- and each multi-token chunk (prefill) gets its own causal call over its slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

import torch
from torch import Tensor

LONG_ROW_FACTOR = 2  # a decode row this many times longer than the median one is attended on its own...
LONG_ROW_MIN = 512  # ...once it is at least this long


@dataclass(frozen=True)
class Chunk:
    """One sequence's part of a forward: `length` tokens at positions start..start+length-1 of cache slot `slot`."""

    slot: int
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class AttentionGroup:
    """Queries that read cache slots lo..hi-1 (up to kv_len positions) in one attention call.

    q_index [b, t]: the token whose query fills each row (rows of slots without a query of
    this group repeat token 0 and their output is dropped); mask [b, 1, t, kv_len] or None
    for plain causal attention from position 0. Outputs go to tokens `dst` (a slice of the
    flattened batch) or, for padded groups, rows `keep` of the output go to tokens `dst_index`.
    """

    lo: int
    hi: int
    kv_len: int
    q_index: Tensor
    mask: Tensor | None
    dst: slice | None = None
    keep: Tensor | None = None
    dst_index: Tensor | None = None
    in_order: bool = False  # rows are tokens 0..b*t-1 in order (a pure decode step): no gather, no scatter


@dataclass(frozen=True)
class DecodeRows:
    """Every token of a forward, attended by the decode-attention kernel: token i attends over the first lengths[i]
    positions of cache slot slots[i] (its own position and those before it)."""

    slots: Tensor  # [N]
    lengths: Tensor  # [N]


@dataclass(frozen=True)
class BatchPlan:
    """Everything about a forward that does not depend on the layer, computed once."""

    chunks: tuple[Chunk, ...]
    token_slots: Tensor  # [N]
    token_positions: Tensor  # [N]
    freqs: Tensor  # [N, rope_dim / 2] complex rotations
    groups: tuple[AttentionGroup, ...]
    last_tokens: Tensor  # [n_chunks] the index of each chunk's last token
    decode: DecodeRows | None = None  # with `decode_kernel`: every token (and then no groups)
    # with `fused_rope` and the decode kernel: `freqs` as [N, rope_dim / 2, 2] (cos, sin)
    rotations: Tensor | None = None
    # sliding-window layers (Gemma 3): their RoPE (None: the global one) and, without the decode kernel, their groups
    local_freqs: Tensor | None = None
    local_rotations: Tensor | None = None
    local_groups: tuple[AttentionGroup, ...] = ()

    def rope(self, local: bool) -> tuple[Tensor, Tensor | None]:
        """(freqs, rotations) for a global layer or a local one."""
        if local and self.local_freqs is not None:
            return self.local_freqs, self.local_rotations
        return self.freqs, self.rotations

    @property
    def n_tokens(self) -> int:
        return int(self.token_slots.shape[0])

    @classmethod
    def build(
        cls,
        chunks: Sequence[Chunk],
        freqs_cis: Tensor,
        dtype: torch.dtype = torch.float32,
        decode_kernel: bool = False,
        fused_rope: bool = False,
        local_freqs: Tensor | None = None,
        window: int = 0,
    ) -> BatchPlan:
        """`dtype`: the activations', for the additive attention masks; `decode_kernel`: every token is attended by
        the decode-attention kernel instead of in groups (the same arithmetic for a token whatever its chunk: a prompt
        whose start came from the prefix cache gives the bits a cold one does; and faster here: a 128-token chunk's
        prefill 1834 -> 2108 tok/s on a Zen 4, where one call of SDPA per chunk and layer was the rule up to now);
        `fused_rope`: the kernel also rotates and stores them (`rotations`); `local_freqs`, `window`: the RoPE and the
        window of sliding-window layers (the decode kernel takes the window itself)."""
        device = freqs_cis.device
        offsets = [0]
        for chunk in chunks:
            offsets.append(offsets[-1] + chunk.length)
        slots = torch.tensor([c.slot for c in chunks for _ in range(c.length)], device=device)
        positions = torch.tensor([p for c in chunks for p in range(c.start, c.end)], device=device)
        decode = DecodeRows(slots=slots, lengths=positions + 1) if decode_kernel else None
        groups = [] if decode_kernel else _groups(chunks, offsets, device, dtype)
        local_groups = _groups(chunks, offsets, device, dtype, window) if window and not decode_kernel else []
        freqs = freqs_cis[positions]
        local = None if local_freqs is None else local_freqs[positions]
        fused = fused_rope and decode is not None
        return cls(
            chunks=tuple(chunks),
            token_slots=slots,
            token_positions=positions,
            freqs=freqs,
            groups=tuple(groups),
            last_tokens=torch.tensor(offsets[1:], device=device) - 1,
            decode=decode,
            rotations=torch.view_as_real(freqs) if fused else None,
            local_freqs=local,
            local_rotations=torch.view_as_real(local) if fused and local is not None else None,
            local_groups=tuple(local_groups),
        )


def _groups(
    chunks: Sequence[Chunk], offsets: list[int], device: torch.device, dtype: torch.dtype, window: int = 0
) -> list[AttentionGroup]:
    """Attention calls without the decode kernel: single-token chunks of ordinary length share one padded call, each
    longer one (a prompt chunk, or a decode row far longer than the rest) gets its own; with a `window`, each query
    sees only its last `window` positions."""
    singles = [(i, c) for i, c in enumerate(chunks) if c.length == 1]
    typical = median(c.end for _, c in singles) if singles else 0
    long_from = max(LONG_ROW_FACTOR * typical, LONG_ROW_MIN)
    short = [(i, c) for i, c in singles if c.end < long_from]
    groups = [_padded_group([(offsets[i], c) for i, c in short], device, dtype, window)] if short else []
    for i, chunk in enumerate(chunks):
        if chunk.length > 1 or chunk.end >= long_from:
            groups.append(_chunk_group(offsets[i], chunk, device, dtype, window))
    return groups


def _additive(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask as the additive one attention adds to its scores (0 where visible, -inf elsewhere), made once per
    forward."""
    return torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))


def _visible(cols: Tensor, last: Tensor, window: int) -> Tensor:
    """Which key positions `cols` [S] each query at position `last` [r] sees: [r, S]."""
    seen = cols[None, :] <= last[:, None]
    return seen & (cols[None, :] > last[:, None] - window) if window else seen


def _padded_group(
    rows: list[tuple[int, Chunk]], device: torch.device, dtype: torch.dtype, window: int = 0
) -> AttentionGroup:
    """Single-token queries over the run of slots they occupy, padded to the longest and masked."""
    lo = min(c.slot for _, c in rows)
    hi = max(c.slot for _, c in rows) + 1
    kv_len = max(c.end for _, c in rows)
    q_index = torch.zeros(hi - lo, 1, dtype=torch.long)
    last = torch.full((hi - lo,), kv_len - 1, dtype=torch.long)  # slots without a query: see everything (finite)
    for token, c in rows:
        q_index[c.slot - lo, 0] = token
        last[c.slot - lo] = c.start
    # Rows that see every position need no mask (a single stream's decode step, or rows all at the same length).
    visible = _visible(torch.arange(kv_len), last, window)[:, None, None, :]  # [b, 1, 1, kv_len]
    mask = None if bool(visible.all()) else _additive(visible, dtype).to(device)
    keep = torch.tensor([c.slot - lo for _, c in rows])
    dst_index = torch.tensor([token for token, _ in rows])
    in_order = lo == 0 and hi == len(rows) and all(token == c.slot for token, c in rows)
    return AttentionGroup(
        lo,
        hi,
        kv_len,
        q_index.to(device),
        mask,
        keep=keep.to(device),
        dst_index=dst_index.to(device),
        in_order=in_order,
    )


def _chunk_group(
    offset: int, chunk: Chunk, device: torch.device, dtype: torch.dtype, window: int = 0
) -> AttentionGroup:
    """One sequence's tokens attending causally over its own slot (each over its last `window` positions)."""
    q_index = torch.arange(offset, offset + chunk.length, device=device)[None]  # [1, t]
    if chunk.start == 0 and (not window or chunk.end <= window):
        mask = None  # plain causal from position 0
    else:
        rows = torch.arange(chunk.start, chunk.end)
        mask = _additive(_visible(torch.arange(chunk.end), rows, window)[None, None], dtype).to(device)  # [1, 1, t, S]
    return AttentionGroup(
        chunk.slot, chunk.slot + 1, chunk.end, q_index, mask, dst=slice(offset, offset + chunk.length)
    )
