"""A real Daphne server (`manage.py serve`) in a subprocess, sharing its SQLite file with the tests.

The server runs two models: `tiny` (a GGUF the tests write, fast) and the real
SmolLM2-135M-Instruct. Tests that talk to it use `django_db(transaction=True)` so that
the keys they create are committed where the server can see them.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from servers import free_port, start, stop, wait_ready

_DB_FILE = Path(tempfile.mkdtemp(prefix="roundtrip-tests-")) / "db.sqlite3"


def pytest_configure(config: pytest.Config) -> None:
    """Tests and the live server share one SQLite file, created and migrated by pytest-django."""
    from django.db import connections

    connections["default"].settings_dict["TEST"]["NAME"] = str(_DB_FILE)


@dataclass
class LiveServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def api(self) -> str:
        return f"{self.url}/v1"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="session")
def daphne_server(django_db_setup: None, tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {
        **os.environ,
        "ROUNDTRIP_SQLITE_PATH": str(_DB_FILE),
        "ROUNDTRIP_MODELS": json.dumps(
            [{"id": "tiny", "path": str(tiny_model_path), "aliases": ["t"]}, {"id": "smollm2-135m-instruct", "path": "", "aliases": ["smollm2"]}]
        ),
        "ROUNDTRIP_MAX_ACTIVE_STREAMS": "4",
        "ROUNDTRIP_MAX_QUEUED": "4",
        "PYTHONUNBUFFERED": "1",
    }
    process = start(env, log, "serve", "--port", str(port))
    server = LiveServer(f"http://127.0.0.1:{port}", process, log)
    try:
        wait_ready(server.url, [process], [log])
        yield server
    finally:
        stop([process])


@pytest.fixture
def make_key(transactional_db: None) -> Any:
    """Create a committed API key the live server can use: `make_key(requests_per_minute=5)` → raw key."""
    from webapp.keys.models import ApiKey

    def make(**fields: Any) -> str:
        fields.setdefault("requests_per_minute", 0)
        fields.setdefault("tokens_per_minute", 0)
        fields.setdefault("concurrent_streams", 0)
        _, raw = ApiKey.create_key(fields.pop("name", "test"), **fields)
        return raw

    return make
