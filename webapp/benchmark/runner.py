"""Runs the workload at each level (a number of concurrent clients, or a request rate) and collects the results."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx

from webapp.benchmark.client import Endpoint, request_body, stream_one
from webapp.benchmark.measure import RequestResult, Targets, summarize
from webapp.benchmark.workload import Item, arrival_gaps


@dataclass(frozen=True)
class Level:
    """Either `concurrency` clients, each sending its next request when the last one ended, or requests
    arriving at `rate` per second (gamma gaps, shape `burstiness`) with no bound on how many run at once."""

    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0

    @property
    def name(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency is not None else f"rate {self.rate:g}/s"


@dataclass
class LevelRun:
    level: Level
    results: list[RequestResult] = field(default_factory=list)
    wall: float = 0.0
    target: str = ""  # which server and model, when a run sweeps several

    @property
    def name(self) -> str:
        return f"{self.target} · {self.level.name}" if self.target else self.level.name

    def summary(self, targets: Targets) -> dict[str, Any]:
        return {"level": self.name, **summarize(self.results, self.wall, targets)}


@dataclass(frozen=True)
class Settings:
    ignore_eos: bool = True
    temperature: float = 0.0
    timeout: float = 300.0  # per request
    max_duration: float = 600.0  # per level: requests not started by then are not sent


Progress = Callable[[RequestResult], None]


async def run_level(
    endpoint: Endpoint,
    level: Level,
    items: list[Item],
    settings: Settings,
    seed: int,
    on_done: Progress = lambda r: None,
) -> LevelRun:
    run = LevelRun(level)
    limits = httpx.Limits(
        max_connections=(level.concurrency or 256) + 4, max_keepalive_connections=(level.concurrency or 256) + 4
    )
    started = time.perf_counter()
    deadline = started + settings.max_duration
    async with httpx.AsyncClient(timeout=settings.timeout, limits=limits) as client:

        async def send(index: int, item: Item) -> None:
            result = RequestResult(index=index, level=level.name, sent=0.0)
            body = request_body(endpoint.model, item.prompt, item.max_tokens, settings.ignore_eos, settings.temperature)
            run.results.append(await stream_one(client, endpoint, body, result, started))
            on_done(result)

        if level.concurrency is not None:
            queue = list(enumerate(items))

            async def worker() -> None:
                while queue and time.perf_counter() < deadline:
                    index, item = queue.pop(0)
                    await send(index, item)

            await asyncio.gather(*(worker() for _ in range(level.concurrency)))
        else:
            assert level.rate is not None
            tasks = []
            gaps = arrival_gaps(level.rate, level.burstiness, seed)
            for index, item in enumerate(items):
                if time.perf_counter() >= deadline:
                    break
                tasks.append(asyncio.create_task(send(index, item)))
                await asyncio.sleep(next(gaps))
            await asyncio.gather(*tasks)
    run.wall = time.perf_counter() - started
    run.results.sort(key=lambda r: r.index)
    return run
