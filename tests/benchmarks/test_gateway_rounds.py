"""The gateway benchmark's rounds at one stream: no target follows another more often than chance, so none pays for
another's work after its answer more than the rest."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from benchmarks.bench_gateway import round_order

NAMES = ["llama-server", "roundtrip", "litellm", "baseline"]


def test_each_target_follows_each_other_about_equally_often() -> None:
    sequence = [name for r in range(400) for name in round_order(NAMES, r)]
    follows = Counter((before, after) for before, after in pairwise(sequence) if before != after)
    assert len(follows) == 12
    expected = sum(follows.values()) / 12  # shuffled: any ordered pair of two targets as likely as any other
    assert all(0.75 * expected < n < 1.25 * expected for n in follows.values()), follows


def test_a_rounds_order_is_the_same_in_every_run() -> None:
    assert [round_order(NAMES, r) for r in range(5)] == [round_order(NAMES, r) for r in range(5)]
    assert sorted(round_order(NAMES, 7)) == sorted(NAMES)
