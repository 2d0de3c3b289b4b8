"""ROUNDTRIP_MODELS entries with a `url`: upstream models, their replicas and fallbacks, read once at start; a
mistake stops the start naming the entry."""

from __future__ import annotations

from typing import Any

import pytest

from webapp.catalog import by_name, configured_models, local_models


def _models(settings: Any, entries: list[dict[str, Any]]) -> None:
    settings.ROUNDTRIP_MODELS = entries


def test_entries_sharing_an_id_are_replicas_of_one_upstream_model(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UP_KEY", "secret")
    _models(
        settings,
        [
            {"id": "local", "path": "", "aliases": ["default"]},
            {
                "id": "far",
                "url": "http://a.example:8080/v1/",
                "api_key_env": "UP_KEY",
                "upstream_model": "m",
                "aliases": ["x"],
            },
            {"id": "far", "url": "http://b.example:8080/v1", "aliases": ["y"], "fallback": ["local"]},
        ],
    )
    local, far = configured_models()
    assert [r.id for r in local_models()] == ["local"] and not local.upstream
    assert far.upstream and far.fallback == ("local",) and far.aliases == ("x", "y")
    a, b = far.replicas
    assert (a.name, a.url, a.model, a.api_key, a.root) == (
        "far@a.example:8080",
        "http://a.example:8080/v1",
        "m",
        "secret",
        "http://a.example:8080",
    )
    assert (b.name, b.model, b.api_key) == ("far@b.example:8080", "far", "")  # the id when no upstream_model is named
    assert by_name()["y"] is far


@pytest.mark.parametrize(
    ("entries", "words"),
    [
        ([{"id": "far", "url": "http://a:1/v1", "api_key_env": "NOT_SET_ANYWHERE"}], "NOT_SET_ANYWHERE"),
        ([{"id": "far", "url": "ftp://a/v1"}], "http(s) url"),
        ([{"id": "far", "url": "http://a:1/v1", "path": "/m.gguf"}], "no path beside it"),
        ([{"id": "far", "url": "http://a:1/v1", "fallback": ["nobody"]}], "falls back to ['nobody']"),
        ([{"id": "m", "path": ""}, {"id": "m", "url": "http://a:1/v1"}], "listed twice"),
    ],
)
def test_a_mistaken_upstream_entry_stops_the_start_naming_it(
    settings: Any, entries: list[dict[str, Any]], words: str
) -> None:
    _models(settings, entries)
    with pytest.raises(
        ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    ):
        configured_models()
