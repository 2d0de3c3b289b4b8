"""The gateway benchmark's rounds: every target as often in every place and after every other, so none pays for
another's work after its answer more than the rest; and how well a run knows its paired medians."""

from __future__ import annotations

import random
import statistics
from collections import Counter
from itertools import pairwise

import pytest

from benchmarks.bench_gateway import median_interval, round_order

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


def test_the_interval_of_a_median_narrows_as_pairs_grow_and_holds_the_median() -> None:
    spread = random.Random(1)
    few = [spread.gauss(2.0, 20.0) for _ in range(100)]
    many = few + [spread.gauss(2.0, 20.0) for _ in range(900)]
    low, high = median_interval(few)
    assert low < statistics.median(few) < high
    narrow_low, narrow_high = median_interval(many)
    assert narrow_low < 2.0 < narrow_high
    assert narrow_high - narrow_low < (high - low) / 2
