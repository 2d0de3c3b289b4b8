"""The benchmark's arithmetic on synthetic streams with known gaps (a fake clock: times are given, not measured)."""

from __future__ import annotations

import math

import pytest

from webapp.benchmark.measure import RequestResult, Targets, distribution, itl_by_position, summarize


def stream(
    index: int,
    sent: float,
    chunks: list[float],
    tokens: int,
    ended: float | None = None,
    per_chunk: list[int] | None = None,
    error: str = "",
) -> RequestResult:
    return RequestResult(
        index=index,
        level="test",
        sent=sent,
        output_tokens=tokens,
        chunk_times=chunks,
        chunk_tokens=per_chunk or [],
        ended=chunks[-1] if ended is None and chunks else ended,
        error=error,
    )


def test_ttft_itl_tpot_and_e2e_of_one_steady_stream() -> None:
    r = stream(0, sent=1.0, chunks=[1.2, 1.25, 1.30, 1.35], tokens=4, ended=1.40)
    assert r.ttft == pytest.approx(0.2)
    assert r.itls() == pytest.approx([0.05, 0.05, 0.05])
    assert r.e2e == pytest.approx(0.4)
    assert r.tpot == pytest.approx((0.4 - 0.2) / 3)


def test_a_chunk_carrying_several_tokens_counts_a_gap_per_token() -> None:
    """Running usage counts say the third chunk carried 3 tokens: its 0.09 s gap becomes three gaps of 0.03 s."""
    r = stream(0, 0.0, [0.1, 0.2, 0.29], tokens=5, per_chunk=[1, 1, 3])
    assert r.itls() == pytest.approx([0.1, 0.03, 0.03, 0.03])


def test_without_running_counts_the_final_count_is_spread_evenly() -> None:
    r = stream(0, 0.0, [0.1, 0.2, 0.3], tokens=6)  # 2 tokens per chunk
    assert r.token_counts() == [2, 2, 2]
    assert r.itls() == pytest.approx([0.05, 0.05, 0.05, 0.05])


def test_percentiles_are_values_that_occurred() -> None:
    d = distribution([float(v) for v in range(1, 101)])
    assert (d["p50"], d["p90"], d["p99"], d["max"]) == (50.0, 90.0, 99.0, 100.0)
    assert d["mean"] == pytest.approx(50.5)
    assert math.isnan(distribution([])["p50"])


def test_failed_and_cancelled_requests_are_counted_by_kind_and_left_out_of_latencies() -> None:
    results = [
        stream(0, 0.0, [0.1, 0.2], tokens=2),
        stream(1, 0.0, [], tokens=0, ended=0.05, error="http_429"),
        stream(2, 0.0, [0.3], tokens=1, error="stream_error:overloaded"),
        stream(3, 0.0, [0.4, 0.5], tokens=2, ended=None),  # the client gave up: no end
        stream(4, 0.0, [], tokens=0, ended=0.01, error="http_429"),
    ]
    results[3].ended = None
    summary = summarize(results, wall=2.0)
    assert summary["succeeded"] == 1
    assert summary["errors"] == {"http_429": 2, "stream_error:overloaded": 1, "incomplete": 1}
    assert summary["ttft"]["max"] == pytest.approx(0.1)  # only the request that succeeded
    assert summary["request_throughput"] == pytest.approx(0.5)
    assert summary["output_throughput"] == pytest.approx(1.0)


def test_goodput_counts_requests_meeting_every_target() -> None:
    results = [
        stream(0, 0.0, [0.1, 0.2], tokens=2),
        stream(1, 0.0, [0.6, 0.7], tokens=2),
        stream(2, 0.0, [0.1, 0.9], tokens=2),
        stream(3, 0.0, [], tokens=0, ended=0.1, error="http_500"),
    ]
    summary = summarize(results, wall=4.0, targets=Targets(ttft=0.5, tpot=0.5))
    assert summary["goodput"] == {
        "requests": 1,
        "fraction": 0.25,
        "per_s": 0.25,
    }  # 1 too slow to start, 2 too slow per token


def test_an_itl_target_fails_a_stream_that_stalls_even_when_its_mean_is_fine() -> None:
    steady = stream(0, 0.0, [0.1 + 0.02 * i for i in range(11)], tokens=11)
    # same 0.4 s, two stalls
    stalling = stream(1, 0.0, [0.1, 0.11, 0.12, 0.13, 0.14, 0.3, 0.31, 0.32, 0.33, 0.34, 0.5], tokens=11)
    summary = summarize([steady, stalling], wall=1.0, targets=Targets(itl=0.05))
    assert summary["goodput"]["requests"] == 1


def test_itl_by_position_is_the_median_over_requests() -> None:
    results = [
        stream(0, 0.0, [0.0, 0.1, 0.3], tokens=3),
        stream(1, 0.0, [0.0, 0.3, 0.4], tokens=3),
        stream(2, 0.0, [0.0, 0.2, 0.5], tokens=3),
    ]
    assert itl_by_position(results) == pytest.approx([0.2, 0.2])
