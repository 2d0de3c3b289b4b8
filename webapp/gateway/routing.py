"""The route stage's lookup: a model id or alias to the model (see `webapp.catalog`), 404 otherwise."""

from __future__ import annotations

from webapp.catalog import ModelRoute, by_name, configured_models
from webapp.gateway.errors import GatewayError


def resolve(name: str) -> ModelRoute:
    """The route for a model id or alias; 404 listing the valid ids otherwise."""
    route = by_name().get(name)
    if route is not None:
        return route
    raise unknown_model(name)


def unknown_model(name: str) -> GatewayError:
    valid = ", ".join(r.id for r in configured_models())
    return GatewayError(
        404,
        f"The model {name!r} does not exist. Available models: {valid}.",
        "invalid_request_error",
        "model_not_found",
        "model",
    )
