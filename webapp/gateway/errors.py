"""Errors the gateway answers with, shaped like OpenAI's so their SDK raises the matching exception."""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    """An HTTP status and an OpenAI-style error body: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, "invalid_request_error", code, param)
