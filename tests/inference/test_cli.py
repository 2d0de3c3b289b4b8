"""`python -m inference PROMPT`: streams the answer, then prints the latency summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from inference.__main__ import main

pytestmark = pytest.mark.live  # runs `python -m inference` in a process of its own

ROOT = Path(__file__).resolve().parents[2]


def test_it_streams_the_answer_and_prints_latencies(tiny_model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["the heat", "--model", str(tiny_model_path), "--max-tokens", "8", "--seed", "1", "--temperature", "1"])
        == 0
    )
    out, err = capsys.readouterr()
    assert out.strip() != ""
    assert "TTFT" in err and "mean inter-token latency" in err and "tokens/s" in err
    assert "finish: length" in err


def test_a_bad_model_path_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hi", "--model", str(tmp_path / "missing.gguf")]) == 2
    assert "missing.gguf: no such file" in capsys.readouterr().err


def test_an_impossible_sampling_value_is_a_clear_error(
    tiny_model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["hi", "--model", str(tiny_model_path), "--temperature", "-1"]) == 2
    assert "temperature must be between 0 and 2" in capsys.readouterr().err


def test_the_seed_question_on_the_real_model(smollm2: object) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "inference", "What's the capital of India?"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "The capital of India is New Delhi."
    assert "TTFT" in done.stderr
