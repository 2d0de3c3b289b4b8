"""What one streamed request took, and the statistics over many: plain arithmetic, no I/O (tested with fake clocks).

Clocks (all `time.perf_counter`, on the client):
- TTFT: from just before the request is sent to the arrival of the first chunk that carries output
  (content or a tool-call delta);
- inter-token latency (ITL): the gap between consecutive output chunks, per token: a chunk that
  carries k tokens contributes k gaps of gap / k. k comes from the server's running usage counts
  when it sends them (`stream_options.continuous_usage_stats`); otherwise the final usage count
  is spread evenly over the chunks (exact when every chunk is one token, the usual case);
- TPOT: (E2E - TTFT) / (output tokens - 1);
- E2E: from the send to the end of the stream (`[DONE]` or the connection closing).
Output tokens are the final usage chunk's `completion_tokens` (counted chunks when a server omits it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestResult:
    """One request as the client saw it; times in seconds from the start of the run."""

    index: int
    level: str  # the workload level it belonged to ("concurrency 8", "rate 4.0/s")
    sent: float
    prompt_tokens: int = 0
    output_tokens: int = 0
    chunk_times: list[float] = field(default_factory=list)  # arrival of every chunk that carried output
    chunk_tokens: list[int] = field(default_factory=list)  # tokens each of them carried, where the server said
    ended: float | None = None
    error: str = ""  # "" when it succeeded; else its kind ("http_429", "stream_error:overloaded", "timeout", ...)
    request_id: str = ""  # the server's id for it (x-request-id), to find it in the server's logs
    server_ttft: float | None = None  # the server's own clocks, where it reports them (seconds)
    server_itl: float | None = None

    @property
    def ok(self) -> bool:
        return not self.error and self.ended is not None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.sent if self.chunk_times else None

    @property
    def e2e(self) -> float | None:
        return self.ended - self.sent if self.ended is not None else None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def token_counts(self) -> list[int]:
        """Tokens per output chunk: the server's running counts, else the final count spread evenly."""
        n = len(self.chunk_times)
        if n == 0:
            return []
        if len(self.chunk_tokens) == n and sum(self.chunk_tokens) > 0:
            return list(self.chunk_tokens)
        total = max(self.output_tokens, n)
        base, extra = divmod(total, n)
        return [base + (1 if i < extra else 0) for i in range(n)]

    def itls(self) -> list[float]:
        """Every inter-token gap, per token (see the module's docstring)."""
        counts = self.token_counts()
        gaps: list[float] = []
        for i in range(1, len(self.chunk_times)):
            gap, k = self.chunk_times[i] - self.chunk_times[i - 1], max(1, counts[i])
            gaps += [gap / k] * k
        return gaps

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(ttft=self.ttft, e2e=self.e2e, tpot=self.tpot, itls=self.itls())
        return data


@dataclass(frozen=True)
class Targets:
    """Service-level objectives for goodput: a request counts when it meets every target given (seconds).
    `itl` applies to the request's 90th-percentile gap, so a stream with stalls fails it even if its mean is fine."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    itl: float | None = None

    def met_by(self, r: RequestResult) -> bool:
        gaps = r.itls()
        itl_p90 = distribution(gaps)["p90"] if gaps else None
        checks = ((self.ttft, r.ttft), (self.tpot, r.tpot), (self.e2e, r.e2e), (self.itl, itl_p90))
        return r.ok and all(limit is None or (value is not None and value <= limit) for limit, value in checks)

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.ttft, self.tpot, self.e2e, self.itl))


PERCENTILES = (50, 90, 99)


def distribution(values: Sequence[float]) -> dict[str, float]:
    """mean, p50, p90, p99 and max (nearest-rank percentiles, so each is a value that occurred); NaN when empty."""
    if not values:
        return dict.fromkeys(("mean", "p50", "p90", "p99", "max", "std"), math.nan)
    ordered = sorted(values)
    out = {"mean": statistics.fmean(ordered), "max": ordered[-1], "std": statistics.pstdev(ordered)}
    for p in PERCENTILES:
        out[f"p{p}"] = ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]
    return out


def summarize(results: Sequence[RequestResult], wall: float, targets: Targets = Targets()) -> dict[str, Any]:
    """The statistics of one level: latency distributions, throughput, goodput, errors by kind, server clocks."""
    done = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            kind = r.error or "incomplete"
            errors[kind] = errors.get(kind, 0) + 1
    output = sum(r.output_tokens for r in done)
    itls = [g for r in done for g in r.itls()]
    server_ttft = [r.server_ttft for r in done if r.server_ttft is not None]
    server_itl = [r.server_itl for r in done if r.server_itl is not None]
    client_itl_means = [statistics.fmean(r.itls()) for r in done if r.server_itl is not None and r.itls()]
    summary: dict[str, Any] = {
        "requests": len(results),
        "succeeded": len(done),
        "errors": errors,
        "wall_s": wall,
        "request_throughput": len(done) / wall if wall > 0 else math.nan,
        "output_throughput": output / wall if wall > 0 else math.nan,
        "output_tokens": output,
        "ttft": distribution([r.ttft for r in done if r.ttft is not None]),
        "itl": distribution(itls),
        "tpot": distribution([r.tpot for r in done if r.tpot is not None]),
        "e2e": distribution([r.e2e for r in done if r.e2e is not None]),
        "server": {
            "ttft": distribution(server_ttft),
            "itl": distribution(server_itl),  # the server's mean ITL per request
            "client_itl": distribution(client_itl_means),  # the client's, over the same requests
        },
    }
    if targets.any:
        good = sum(targets.met_by(r) for r in results)
        summary["goodput"] = {
            "requests": good,
            "fraction": good / len(results) if results else math.nan,
            "per_s": good / wall if wall > 0 else math.nan,
        }
    return summary


def itl_by_position(results: Sequence[RequestResult]) -> list[float]:
    """The median inter-token gap at each output position (1 = between the first and second token)."""
    columns: dict[int, list[float]] = {}
    for r in results:
        if r.ok:
            for i, gap in enumerate(r.itls(), start=1):
                columns.setdefault(i, []).append(gap)
    return [statistics.median(columns[i]) for i in sorted(columns)]
