"""The engine's memory: importing it must not pull in torch's compiler stack (dynamo and inductor cost ~130 MB of
resident memory and seconds of start-up; a served model has a 500 MiB budget)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.live  # imports the engine in a fresh interpreter

ROOT = Path(__file__).resolve().parents[2]
ENGINE_MODULES = [
    "inference.loader",
    "inference.scheduler",
    "inference.grammar",
    "inference.int4_gemm",
    "webapp.worker.runner",
]


def test_importing_the_engine_leaves_torchs_compiler_out() -> None:
    code = (
        "import django, os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'webapp.settings'); django.setup();"
        f"[__import__(m) for m in {ENGINE_MODULES!r}];"
        "print(sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'torch._inductor'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
