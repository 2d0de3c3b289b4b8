"""A request as an upstream server is asked it: OpenAI's chat or text completion body, always streamed (so the
gateway sees the first token, can stop the upstream when its client leaves, and counts usage from the last chunk).

Sampling values go as OpenAI names them; top_k, min_p and repetition_penalty (which llama-server, vLLM and Roundtrip
read) only when set. When the page watches (a trace level above "off"), the upstream is asked for each token's
log-probabilities and its top 10 alternatives, which the sampling stage draws; the API shows them only when asked.
"""

from __future__ import annotations

from typing import Any

from inference.params import SamplingParams
from webapp.catalog import Upstream
from webapp.gateway.errors import bad_request

PAGE_TOP_LOGPROBS = 10


def body(
    upstream: Upstream,
    messages: list[dict[str, Any]],
    params: SamplingParams,
    level: str,
    passthrough: dict[str, Any] | None = None,
    *,
    prompt: str | None = None,
    n: int = 1,
    tools: list[dict[str, Any]] | None = None,
    fit_max_tokens: bool = False,
    continue_final: bool = False,
    step: bool = False,
    truncate_history: bool = False,
) -> tuple[str, dict[str, Any]]:
    """(path under the upstream's /v1, JSON body) for one generation."""
    if step:
        raise bad_request("Step mode needs a model this server runs: an upstream server streams on its own.", "step")
    del truncate_history  # the upstream fits its own context
    out: dict[str, Any] = {"model": upstream.model, "stream": True, "stream_options": {"include_usage": True}}
    if prompt is not None:
        path, out["prompt"] = "/completions", prompt
    else:
        path, out["messages"] = "/chat/completions", messages
        if continue_final:
            out |= {"continue_final_message": True, "add_generation_prompt": False}
        if tools:
            out["tools"] = [{"type": "function", "function": tool} for tool in tools]
    out |= _sampling(params, n, fit_max_tokens)
    top = params.top_logprobs or (PAGE_TOP_LOGPROBS if level != "off" else 0)
    if top or (passthrough or {}).get("logprobs"):
        out |= {"logprobs": top} if prompt is not None else {"logprobs": True, "top_logprobs": top}
    return path, out | (passthrough or {})


def _sampling(params: SamplingParams, n: int, fit_max_tokens: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"temperature": params.temperature, "top_p": params.top_p}
    if not fit_max_tokens:  # the client's own limit; without one, the upstream's default applies
        out["max_tokens"] = params.max_tokens
    if n != 1:
        out["n"] = n
    optional = {
        "seed": params.seed,
        "stop": list(params.stop) or None,
        "presence_penalty": params.presence_penalty or None,
        "frequency_penalty": params.frequency_penalty or None,
        "logit_bias": {str(token): bias for token, bias in params.logit_bias} or None,
        "top_k": params.top_k or None,
        "min_p": params.min_p or None,
        "repetition_penalty": params.repetition_penalty if params.repetition_penalty != 1.0 else None,
        "ignore_eos": params.ignore_eos or None,
    }
    return out | {name: value for name, value in optional.items() if value is not None}
