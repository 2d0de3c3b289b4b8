"""A request as the upstream is asked it (`webapp.gateway.upstream.request_body`)."""

from __future__ import annotations

import pytest

from inference.params import SamplingParams
from webapp.catalog import Upstream
from webapp.gateway.errors import GatewayError
from webapp.gateway.upstream.request_body import PAGE_TOP_LOGPROBS, body

SERVER = Upstream("far@h:1", "http://h:1/v1", "their-name")
MESSAGES = [{"role": "user", "content": "hi"}]


def test_a_chat_request_is_streamed_under_the_upstreams_model_name_with_usage() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=12, stop=("\n",), seed=3, logit_bias=((5, -100.0),), top_k=4)
    path, sent = body(SERVER, MESSAGES, params, "off", {"response_format": {"type": "json_object"}})
    assert path == "/chat/completions"
    assert sent["model"] == "their-name" and sent["stream"] and sent["stream_options"] == {"include_usage": True}
    assert (sent["max_tokens"], sent["stop"], sent["seed"], sent["logit_bias"], sent["top_k"]) == (
        12,
        ["\n"],
        3,
        {"5": -100.0},
        4,
    )
    assert sent["response_format"] == {"type": "json_object"}
    assert "logprobs" not in sent and "min_p" not in sent and "repetition_penalty" not in sent


def test_a_watched_turn_asks_for_the_top_alternatives_and_an_unset_limit_is_the_upstreams() -> None:
    _, sent = body(SERVER, MESSAGES, SamplingParams(), "summary", fit_max_tokens=True)
    assert (sent["logprobs"], sent["top_logprobs"]) == (True, PAGE_TOP_LOGPROBS) and "max_tokens" not in sent
    path, text = body(SERVER, [], SamplingParams(top_logprobs=3), "off", prompt="once")
    assert path == "/completions" and text["prompt"] == "once" and text["logprobs"] == 3


def test_step_mode_is_refused_for_an_upstream_model() -> None:
    with pytest.raises(GatewayError) as refused:
        body(SERVER, MESSAGES, SamplingParams(), "summary", step=True)
    assert refused.value.status == 400 and refused.value.param == "step"
