"""The gateway benchmark's rounds: every target as often in every place and after every other, so none pays for
another's work after its answer more than the rest."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from benchmarks.bench_gateway import round_order

NAMES = ["llama-server", "roundtrip", "litellm", "baseline"]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_within_a_block_of_rounds_every_target_is_in_every_place_and_after_every_other_equally_often(n: int) -> None:
    names = NAMES[:n]
    block = [round_order(names, r) for r in range(n if n % 2 == 0 else 2 * n)]  # a Williams design's rows
    assert all(sorted(order) == sorted(names) for order in block)
    places = Counter((place, name) for order in block for place, name in enumerate(order))
    assert set(places.values()) == {len(block) // n}
    follows = Counter(pair for order in block for pair in pairwise(order))
    assert len(follows) == n * (n - 1) and len(set(follows.values())) == 1


def test_over_a_run_each_target_follows_each_other_about_equally_often() -> None:
    sequence = [name for r in range(400) for name in round_order(NAMES, r)]
    follows = Counter((before, after) for before, after in pairwise(sequence) if before != after)
    assert len(follows) == 12
    expected = sum(follows.values()) / 12
    assert all(0.85 * expected < n < 1.15 * expected for n in follows.values()), follows


def test_a_rounds_order_is_the_same_in_every_run() -> None:
    assert [round_order(NAMES, r) for r in range(9)] == [round_order(NAMES, r) for r in range(9)]
