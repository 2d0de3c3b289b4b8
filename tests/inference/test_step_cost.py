"""The step-cost line the scheduler sizes prompt chunks by: fitted from observed steps, silent until it can be."""

from __future__ import annotations

import pytest

from inference.step_cost import MIN_OBSERVATIONS, StepCost


def _observed(line: tuple[float, float], rows: list[int], window: int = 512) -> StepCost:
    cost = StepCost(window)
    for r in rows:
        cost.observe(r, line[0] + line[1] * r)
    return cost


def test_it_recovers_the_fixed_and_per_row_cost_of_exact_steps() -> None:
    cost = _observed((0.005, 0.0007), [1, 8, 8, 3, 16, 8] * 4)
    fit = cost.line()
    assert fit is not None
    assert fit[0] == pytest.approx(0.005) and fit[1] == pytest.approx(0.0007)


def test_it_says_nothing_before_enough_steps_or_from_one_row_count() -> None:
    assert _observed((0.005, 0.001), [1, 8] * (MIN_OBSERVATIONS // 2 - 1)).line() is None
    assert _observed((0.005, 0.001), [8] * 100).rows_within(2.0) is None  # one batch size fixes no slope
    assert _observed((0.005, 0.001), [1, 8] * MIN_OBSERVATIONS).line() is not None


def test_it_ignores_a_slope_that_noise_made_negative() -> None:
    cost = StepCost()
    for i in range(40):
        cost.observe(1 + i % 4, 0.010 - 0.0001 * (i % 4))
    assert cost.line() is None


def test_it_forgets_steps_older_than_its_window() -> None:
    cost = _observed((0.050, 0.010), [1, 9] * 50, window=64)  # a slow machine, then a fast one
    for r in [1, 9] * 32:
        cost.observe(r, 0.005 + 0.001 * r)
    fit = cost.line()
    assert fit is not None and fit[0] == pytest.approx(0.005) and fit[1] == pytest.approx(0.001)


def test_it_counts_the_rows_that_fit_in_a_number_of_one_row_steps() -> None:
    cost = _observed((0.005, 0.001), [1, 4, 12] * 10)  # a one-row step: 6 ms
    assert cost.rows_within(1.75) == 5  # 10.5 ms: 5 ms fixed, 5 rows
    assert cost.rows_within(1.0) == 1
