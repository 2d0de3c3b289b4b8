"""`/v1/tokenize` and `/v1/detokenize` for an upstream model, by the upstream's own tokenizer: a second Roundtrip's
`/v1/tokenize`, llama-server's `/tokenize` (with pieces; `/apply-template` first for messages) or vLLM's `/tokenize`
(with token strings). Which one a server speaks is found on first use and remembered. A server with none of them
gets a clear 501, never a guess from another model's tokenizer.
"""

from __future__ import annotations

import json
from typing import Any

from webapp.catalog import ModelRoute, Upstream
from webapp.gateway.errors import GatewayError
from webapp.gateway.upstream import connection, replicas
from webapp.worker import wire

_dialects: dict[str, str] = {}  # upstream name -> "roundtrip" | "root"


async def _post(upstream: Upstream, url: str, payload: dict[str, Any]) -> tuple[int, Any]:
    try:
        async with connection.http().post(
            url, data=json.dumps(payload), headers=connection.headers(upstream)
        ) as response:
            status, text = response.status, await response.read()
    except connection.FAILURES as exc:
        raise GatewayError(
            502,
            f"The upstream {upstream.name} did not answer ({type(exc).__name__}).",
            "server_error",
            "upstream_unavailable",
        ) from None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    return status, data


def _server(route: ModelRoute) -> Upstream:
    """An up replica (the fewest in flight), else the first."""
    up = [r for r in route.replicas if replicas.state(r).up] or list(route.replicas)
    return min(up, key=lambda r: replicas.state(r).in_flight)


def _unavailable(upstream: Upstream) -> GatewayError:
    return GatewayError(
        501,
        f"The upstream {upstream.name} exposes no tokenizer this server knows (Roundtrip's /v1/tokenize, "
        "llama-server's or vLLM's /tokenize).",
        "invalid_request_error",
        "tokenizer_unavailable",
    )


def _refused(upstream: Upstream, status: int, data: Any) -> GatewayError:
    return connection.refused(upstream, status, json.dumps(data).encode())


async def tokenize(
    route: ModelRoute,
    text: str | None = None,
    messages: list[dict[str, Any]] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> wire.Tokens:
    """Ids and token strings of `text`, or of `messages` as the upstream's chat template renders them."""
    upstream = _server(route)
    dialect = _dialects.get(upstream.name)
    if dialect in (None, "roundtrip"):
        payload: dict[str, Any] = {"model": upstream.model}
        if messages is not None:
            payload |= {"messages": messages, "tools": tools} if tools else {"messages": messages}
        else:
            payload["text"] = text or ""
        status, data = await _post(upstream, upstream.url + "/tokenize", payload)
        if status == 200 and isinstance(data, dict) and isinstance(data.get("ids"), list):
            _dialects[upstream.name] = "roundtrip"
            return wire.Tokens(
                request_id="",
                ids=data["ids"],
                tokens=data.get("tokens", []),
                spans=[tuple(s) for s in data.get("spans", [])],
                text=data.get("prompt"),
                segments=None,
            )
        if status not in (404, 405):
            raise _refused(upstream, status, data)
    return await _root_tokenize(upstream, text, messages)


async def _root_tokenize(upstream: Upstream, text: str | None, messages: list[dict[str, Any]] | None) -> wire.Tokens:
    """llama-server's or vLLM's /tokenize, at the server's root (one body both read)."""
    payload: dict[str, Any] = {"model": upstream.model, "with_pieces": True, "return_token_strs": True}
    if messages is not None:
        status, data = await _post(upstream, upstream.root + "/apply-template", {"messages": messages})
        if status == 200 and isinstance(data, dict) and isinstance(data.get("prompt"), str):
            text = data["prompt"]  # llama-server rendered it; vLLM takes the messages themselves
        else:
            payload["messages"] = messages
    if "messages" not in payload:
        payload |= {"content": text or "", "prompt": text or "", "add_special": False, "add_special_tokens": False}
    status, data = await _post(upstream, upstream.root + "/tokenize", payload)
    if status in (404, 405) or not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
        raise _unavailable(upstream) if status in (404, 405, 200) else _refused(upstream, status, data)
    _dialects[upstream.name] = "root"
    entries = data["tokens"]
    if entries and isinstance(entries[0], dict):  # llama-server: {"id", "piece"}
        ids = [int(e["id"]) for e in entries]
        pieces = [_piece(e.get("piece", "")) for e in entries]
    else:  # vLLM: ids, and token_strs when it was asked for them
        ids = [int(e) for e in entries]
        pieces = [str(p) for p in data.get("token_strs") or [""] * len(ids)]
    spans, at = [], 0
    for piece in pieces:
        spans.append((at, at + len(piece)))
        at += len(piece)
    return wire.Tokens(request_id="", ids=ids, tokens=pieces, spans=spans, text=text if messages else None)


def _piece(piece: Any) -> str:
    """llama-server writes a piece that is not whole UTF-8 as its byte values."""
    if isinstance(piece, list):
        return bytes(int(b) & 0xFF for b in piece).decode("utf-8", "replace")
    return str(piece)


async def detokenize(route: ModelRoute, ids: list[int]) -> str:
    upstream = _server(route)
    if _dialects.get(upstream.name) in (None, "roundtrip"):
        status, data = await _post(upstream, upstream.url + "/detokenize", {"model": upstream.model, "tokens": ids})
        if status == 200 and isinstance(data, dict) and isinstance(data.get("text"), str):
            _dialects[upstream.name] = "roundtrip"
            return str(data["text"])
        if status not in (404, 405):
            raise _refused(upstream, status, data)
    status, data = await _post(upstream, upstream.root + "/detokenize", {"model": upstream.model, "tokens": ids})
    if status == 200 and isinstance(data, dict):
        found = data.get("content", data.get("prompt"))
        if isinstance(found, str):
            return found
    raise _unavailable(upstream) if status in (404, 405, 200) else _refused(upstream, status, data)
