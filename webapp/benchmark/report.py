"""The benchmark's outputs: a table on the terminal (rich), a JSON file with every request's raw timings and the
summary, a CSV of the requests, and PNG plots (matplotlib) beside the JSON file."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from webapp.benchmark.measure import itl_by_position
from webapp.benchmark.runner import LevelRun

METRICS = (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "E2E"))


def _ms(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1000:.1f}"


def print_table(summaries: Sequence[dict[str, Any]], console: Console) -> None:
    """Per level: throughput, goodput and errors; each latency's mean/p50/p90/p99/max; server clocks beside the
    client's."""
    table = Table(title="throughput, measured on the client")
    for column in ("level", "ok / sent", "requests/s", "output tokens/s", "goodput", "errors"):
        table.add_column(column, justify="right")
    for s in summaries:
        good = s.get("goodput")
        table.add_row(
            s["level"],
            f"{s['succeeded']} / {s['requests']}",
            f"{s['request_throughput']:.2f}",
            f"{s['output_throughput']:.1f}",
            f"{good['fraction']:.0%} ({good['per_s']:.2f}/s)" if good else "-",
            ", ".join(f"{kind}: {n}" for kind, n in s["errors"].items()) or "none",
        )
    console.print(table)
    latency = Table(title="latency (ms), measured on the client")
    for column in ("level", "metric", "mean", "p50", "p90", "p99", "max"):
        latency.add_column(column, justify="right")
    for s in summaries:
        for key, label in METRICS:
            latency.add_row(s["level"], label, *(_ms(s[key][k]) for k in ("mean", "p50", "p90", "p99", "max")))
    console.print(latency)
    server = [s for s in summaries if s["server"]["ttft"]["p50"] == s["server"]["ttft"]["p50"]]  # NaN when not reported
    if server:
        clocks = Table(
            title="server clocks beside client clocks (p50, ms): the difference is network, HTTP and framework"
        )
        for column in ("level", "TTFT client", "TTFT server", "difference", "ITL client", "ITL server", "difference"):
            clocks.add_column(column, justify="right")
        for s in server:
            tc, ts = s["ttft"]["p50"], s["server"]["ttft"]["p50"]
            ic, its = s["server"]["client_itl"]["p50"], s["server"]["itl"]["p50"]
            clocks.add_row(s["level"], _ms(tc), _ms(ts), _ms(tc - ts), _ms(ic), _ms(its), _ms(ic - its))
        console.print(clocks)


def write_files(
    output: Path, runs: Sequence[LevelRun], summaries: Sequence[dict[str, Any]], meta: dict[str, Any]
) -> list[Path]:
    """OUTPUT (JSON), OUTPUT with .csv, and OUTPUT-*.png: every file written."""
    output.parent.mkdir(parents=True, exist_ok=True)
    requests = [r.to_dict() for run in runs for r in run.results]
    output.write_text(
        json.dumps({"meta": meta, "summary": list(summaries), "requests": requests}, indent=1, default=_plain)
    )
    written = [output]
    csv_path = output.with_suffix(".csv")
    with csv_path.open("w", newline="") as f:
        columns = [
            "level",
            "index",
            "request_id",
            "sent",
            "ended",
            "error",
            "prompt_tokens",
            "output_tokens",
            "ttft",
            "tpot",
            "e2e",
            "server_ttft",
            "server_itl",
        ]
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(requests)
    written.append(csv_path)
    written += plot(output, runs, summaries)
    return written


def _plain(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else str(value)


def plot(output: Path, runs: Sequence[LevelRun], summaries: Sequence[dict[str, Any]]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stem = output.with_suffix("")
    paths = []
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ttfts = {run.name: [r.ttft * 1000 for r in run.results if r.ok and r.ttft is not None] for run in runs}
    itls = {run.name: [g * 1000 for r in run.results if r.ok for g in r.itls()] for run in runs}
    for ax, data, bins in ((axes[0], ttfts, 30), (axes[1], itls, 60)):
        every = [v for values in data.values() for v in values]
        edges = np.histogram_bin_edges(every, bins=bins) if every else bins  # the same bins for every level
        for name, values in data.items():
            ax.hist(values, bins=edges, alpha=0.6, label=name)
    axes[0].set(title="time to first token", xlabel="ms", ylabel="requests")
    axes[1].set(title="inter-token latency", xlabel="ms", ylabel="tokens")
    for ax in axes:
        ax.legend(fontsize=8)
    paths.append(_save(fig, f"{stem}-distributions.png"))

    if len(summaries) > 1:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        names = [s["level"] for s in summaries]
        x = range(len(names))
        axes[0].plot(x, [s["output_throughput"] for s in summaries], marker="o")
        axes[0].set(title="output throughput", ylabel="tokens/s")
        for key, label in (("ttft", "TTFT p50"), ("itl", "ITL p50"), ("e2e", "E2E p50")):
            axes[1].plot(x, [s[key]["p50"] * 1000 for s in summaries], marker="o", label=label)
        axes[1].plot(x, [s["itl"]["p99"] * 1000 for s in summaries], marker="o", linestyle="--", label="ITL p99")
        axes[1].set(title="latency", ylabel="ms", yscale="log")
        axes[1].legend(fontsize=8)
        for ax in axes:
            ax.set_xticks(list(x), names, rotation=20, fontsize=8)
        paths.append(_save(fig, f"{stem}-levels.png"))

    fig, ax = plt.subplots(figsize=(11, 3.5))
    for run in runs:
        medians = itl_by_position(run.results)
        ax.plot(range(1, len(medians) + 1), [m * 1000 for m in medians], label=run.name)
    ax.set(title="inter-token latency by output position (median over requests)", xlabel="token position", ylabel="ms")
    ax.legend(fontsize=8)
    paths.append(_save(fig, f"{stem}-itl-by-position.png"))
    return paths


def _save(fig: Any, path: str) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return Path(path)
