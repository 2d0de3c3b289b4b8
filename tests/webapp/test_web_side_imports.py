"""The web side (views, consumers, gateway, API) talks to the engine only over the channel layer: it never imports
torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
from servers import ROOT

pytestmark = pytest.mark.live  # imports the web side in a fresh interpreter

WEB_MODULES = [
    "webapp.urls",
    "webapp.api.views",
    "visualizer.consumers",
    "visualizer.views",
    "webapp.gateway.client",
    "webapp.metrics.views",
    "webapp.worker.registry",
    "webapp.worker.wire",
    "webapp.catalog",
    "visualizer.watch",
    "webapp.worker.inprocess",
]


def test_importing_the_web_side_leaves_torch_out_of_sys_modules() -> None:
    code = (
        "import django, os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'webapp.settings'); django.setup();"
        f"[__import__(m) for m in {WEB_MODULES!r}];"
        "from webapp.asgi import application;"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
