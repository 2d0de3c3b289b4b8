"""Streams one chat completion from any OpenAI-compatible server and records when each piece arrived.

Plain httpx, no Django: `python -m webapp.benchmark` runs without settings. Server clocks are
read where a server reports them in its final chunk: Roundtrip's `roundtrip_timings` (ttft_ms,
mean_itl_ms) and llama.cpp's `timings` (prompt_ms — its prompt processing, shown as its TTFT —
and predicted_per_token_ms).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx

from webapp.benchmark.measure import RequestResult


@dataclass(frozen=True)
class Endpoint:
    url: str  # the /v1 base
    api_key: str
    model: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def request_body(model: str, prompt: str, max_tokens: int, ignore_eos: bool, temperature: float) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": temperature,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM, llama.cpp and Roundtrip: exactly max_tokens tokens
    return body


async def stream_one(
    client: httpx.AsyncClient, endpoint: Endpoint, body: dict[str, Any], result: RequestResult, started: float
) -> RequestResult:
    """Send `body`, fill `result` as chunks arrive; every failure becomes `result.error`, never an exception."""
    result.sent = time.perf_counter() - started
    seen_tokens = 0
    try:
        async with client.stream(
            "POST", f"{endpoint.url}/chat/completions", json=body, headers=endpoint.headers
        ) as response:
            result.request_id = response.headers.get("x-request-id", "")
            if response.status_code != 200:
                result.error = f"http_{response.status_code}"
                await response.aread()
                return result
            async for line in response.aiter_lines():
                now = time.perf_counter() - started
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    error = chunk["error"] if isinstance(chunk["error"], dict) else {"code": str(chunk["error"])}
                    result.error = f"stream_error:{error.get('code') or error.get('type') or 'error'}"
                    return result
                usage = chunk.get("usage") or {}
                if _carries_output(chunk):
                    result.chunk_times.append(now)
                    total = usage.get("completion_tokens")
                    if isinstance(total, int):  # running counts: this chunk's share is the difference
                        result.chunk_tokens.append(max(0, total - seen_tokens))
                        seen_tokens = total
                if usage:
                    result.output_tokens = int(usage.get("completion_tokens") or result.output_tokens)
                    result.prompt_tokens = int(usage.get("prompt_tokens") or result.prompt_tokens)
                _read_server_clocks(chunk, result)
            result.ended = time.perf_counter() - started
            if not result.output_tokens:
                result.output_tokens = len(result.chunk_times)
    except httpx.TimeoutException:
        result.error = "timeout"
    except httpx.HTTPError as exc:
        result.error = f"connection:{type(exc).__name__}"
    except (ValueError, KeyError) as exc:
        result.error = f"bad_stream:{type(exc).__name__}"
    return result


def _carries_output(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
            return True
    return False


def _read_server_clocks(chunk: dict[str, Any], result: RequestResult) -> None:
    ours = chunk.get("roundtrip_timings")
    if isinstance(ours, dict):
        result.server_ttft = _seconds(ours.get("ttft_ms"))
        result.server_itl = _seconds(ours.get("mean_itl_ms"))
    theirs = chunk.get("timings")
    if isinstance(theirs, dict):
        result.server_ttft = _seconds(theirs.get("prompt_ms"))
        result.server_itl = _seconds(theirs.get("predicted_per_token_ms"))


def _seconds(ms: Any) -> float | None:
    return float(ms) / 1000 if isinstance(ms, (int, float)) else None
