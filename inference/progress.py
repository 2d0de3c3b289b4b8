"""Progress reports while a model loads: a terminal bar, or events a web page can show."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LoadProgress:
    """`done` of `total` units finished in `stage` (reading, kernels, converting, cache, building)."""

    stage: str
    done: int
    total: int
    detail: str = ""

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


ProgressCallback = Callable[[LoadProgress], None]


def terminal_progress() -> ProgressCallback:
    """A tqdm bar on stderr, one per stage."""
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}

    def report(p: LoadProgress) -> None:
        bar = bars.get(p.stage)
        if bar is None:
            bar = bars[p.stage] = tqdm(total=p.total, desc=p.stage, unit="step", leave=False)
        bar.n = p.done
        bar.set_postfix_str(p.detail, refresh=False)
        bar.refresh()
        if p.done >= p.total:
            bar.close()

    return report
