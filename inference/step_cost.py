"""What a forward step costs per row, measured on the steps this engine ran.

A step's time is close to a line in its row count: a fixed part (every weight read once, a few hundred
operator launches) and a part per row (its share of the multiplies). The ratio between the two is the
machine's: on 2 CPU cores a row costs about a tenth of a one-row step, on a GPU or with AMX a small
fraction of that. The scheduler asks how many rows a step may carry within a time (see
`Scheduler._rows_beside`), so a newcomer's prompt is fed beside the decoding streams as fast as
the machine allows without stretching their gaps between tokens past a bound.
"""

from __future__ import annotations

from collections import deque

MIN_OBSERVATIONS = 16  # steps before a fit is trusted
MIN_ROW_VARIANCE = 0.25  # ...and their row counts must vary at least this much: one row count alone fixes no slope


class StepCost:
    """A least-squares line, seconds = fixed + per_row * rows, over the latest `window` steps (running sums: a query
    costs the same whatever the window)."""

    def __init__(self, window: int = 512) -> None:
        self._steps: deque[tuple[int, float]] = deque()
        self._window = window
        self._sums = [0.0, 0.0, 0.0, 0.0]  # rows, seconds, rows^2, rows * seconds

    def observe(self, rows: int, seconds: float) -> None:
        self._steps.append((rows, seconds))
        self._add(rows, seconds, 1.0)
        if len(self._steps) > self._window:
            self._add(*self._steps.popleft(), -1.0)

    def _add(self, rows: int, seconds: float, sign: float) -> None:
        for i, term in enumerate((rows, seconds, rows * rows, rows * seconds)):
            self._sums[i] += sign * term

    def line(self) -> tuple[float, float] | None:
        """(fixed, per_row) seconds, or None while the steps seen cannot tell them apart."""
        n = len(self._steps)
        rows, seconds, squares, products = self._sums
        variance = squares - rows * rows / n if n else 0.0
        if n < MIN_OBSERVATIONS or variance < MIN_ROW_VARIANCE * n:
            return None
        per_row = (products - rows * seconds / n) / variance
        if per_row <= 0.0:  # noise swamped the rows' cost: no usable slope
            return None
        return (seconds - per_row * rows) / n, per_row

    def rows_within(self, one_row_steps: float) -> int | None:
        """The most rows a step is expected to carry in the time of `one_row_steps` one-row steps, or None without a
        fit."""
        fit = self.line()
        if fit is None:
            return None
        fixed, per_row = fit
        return max(0, int((one_row_steps * (fixed + per_row) - fixed) / per_row))
