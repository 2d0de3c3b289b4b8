"""Keys and values of every running sequence, in one tensor with a slot per sequence.

Layout [n_layers, slots, n_kv_heads, capacity, head_dim]: one layer's slots `lo..hi` up
to a length is a plain view, exactly what attention reads, so a batched decode step reads
the cache without copying it. The scheduler keeps running sequences in slots 0..n-1
(`move` fills the hole a finished sequence leaves) and grows or shrinks the tensor as the
longest sequence needs; its byte size is what the KV budget counts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from inference.batch import BatchPlan
from inference.config import ModelConfig

CAPACITY_STEP = 256  # positions are allocated in multiples of this, so the tensor is rarely regrown


def round_capacity(positions: int) -> int:
    return max(CAPACITY_STEP, -(-positions // CAPACITY_STEP) * CAPACITY_STEP)


class SlotCache:
    def __init__(
        self, config: ModelConfig, device: torch.device, dtype: torch.dtype, slots: int = 0, capacity: int = 0
    ) -> None:
        self.config = config
        self.device = device
        self.dtype = dtype
        self.k = self._zeros(slots, capacity)
        self.v = self._zeros(slots, capacity)

    def _zeros(self, slots: int, capacity: int) -> Tensor:
        # Zeros, not empty: positions past a row's length are read (and masked) by batched attention,
        # and must be finite for the mask to remove them. Later writes only ever leave finite values.
        c = self.config
        return torch.zeros(
            (c.n_layers, slots, c.n_kv_heads, capacity, c.head_dim), device=self.device, dtype=self.dtype
        )

    @property
    def slots(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def bytes_per_position(self) -> int:
        """Keys and values of one position in every layer."""
        c = self.config
        return 2 * c.n_layers * c.n_kv_heads * c.head_dim * self.k.element_size()

    @property
    def nbytes(self) -> int:
        return self.slots * self.capacity * self.bytes_per_position

    def resize(self, slots: int, capacity: int, keep: list[int]) -> None:
        """Reallocate to `slots` x `capacity`, keeping the first keep[i] positions of slot i."""
        if (slots, capacity) == (self.slots, self.capacity):
            return
        k, v = self._zeros(slots, capacity), self._zeros(slots, capacity)
        for slot, length in enumerate(keep):
            k[:, slot, :, :length] = self.k[:, slot, :, :length]
            v[:, slot, :, :length] = self.v[:, slot, :, :length]
        self.k, self.v = k, v

    def write(self, layer: int, plan: BatchPlan, k: Tensor, v: Tensor) -> None:
        """Store k, v [N, n_kv, hd] of the plan's N tokens at their slots and positions."""
        k, v = k.to(self.dtype), v.to(self.dtype)  # rounded once, here, when the cache is float16
        if len(plan.chunks) == 1:  # one sequence (a stream's decode step, a prompt chunk): a plain slice
            c = plan.chunks[0]
            self.k[layer, c.slot, :, c.start : c.end] = k.transpose(0, 1)  # [n_kv, N, hd]
            self.v[layer, c.slot, :, c.start : c.end] = v.transpose(0, 1)
            return
        # Advanced indices around a slice put their dim first: the target view is [N, n_kv, hd].
        self.k[layer][plan.token_slots, :, plan.token_positions] = k
        self.v[layer][plan.token_slots, :, plan.token_positions] = v

    def layer(self, layer: int) -> tuple[Tensor, Tensor]:
        """One layer's keys and values [slots, n_kv, capacity, hd]: contiguous views."""
        return self.k[layer], self.v[layer]

    def view(self, layer: int, lo: int, hi: int, length: int) -> tuple[Tensor, Tensor]:
        """Keys and values [hi - lo, n_kv, length, hd] of slots lo..hi-1: a view, no copy."""
        return self.k[layer, lo:hi, :, :length], self.v[layer, lo:hi, :, :length]

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy a sequence's first `length` positions from slot src to slot dst."""
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]

    def read(self, slot: int, start: int, end: int) -> tuple[Tensor, Tensor]:
        """A copy of positions start..end-1 of a slot: [n_layers, n_kv, end - start, hd] each."""
        return self.k[:, slot, :, start:end].clone(), self.v[:, slot, :, start:end].clone()

    def load(self, slot: int, start: int, k: Tensor, v: Tensor) -> None:
        """Put [n_layers, n_kv, n, hd] keys and values at positions start..start+n-1 of a slot."""
        end = start + k.shape[2]
        self.k[:, slot, :, start:end] = k
        self.v[:, slot, :, start:end] = v
