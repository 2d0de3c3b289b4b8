"""The OpenAI-compatible API on a live server (`manage.py serve`), driven by the official openai SDK and raw HTTP."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import httpx2 as httpx
import openai
import pytest
from conftest import PRICES
from django.utils import timezone
from openai import OpenAI
from servers import clear_of_minute_edge

from webapp.keys.models import ApiKey
from webapp.usage.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)
SEED_QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the capital of India?"},
]
HI = [{"role": "user", "content": "the heat is on"}]


def sdk(site_server: Any, key: str) -> OpenAI:
    return OpenAI(base_url=site_server.api, api_key=key, max_retries=0, timeout=120)


def _usage(request_id: str, timeout: float = 10.0) -> UsageRecord:
    """The usage row for a request (the server writes it as the request ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = UsageRecord.objects.filter(request_id=request_id).first()
        if row is not None:
            return row
        time.sleep(0.05)
    raise AssertionError(f"no usage row for {request_id}")


def test_the_seed_question_through_the_sdk(site_server: Any, make_key: Any) -> None:
    # type: ignore[arg-type]
    reply = sdk(site_server, make_key()).chat.completions.create(model="smollm2", messages=SEED_QUESTION, temperature=0)
    assert reply.choices[0].message.content == "The capital of India is New Delhi."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "smollm2-135m-instruct" and reply.object == "chat.completion"
    assert reply.usage is not None and (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (27, 9)
    timings = (reply.model_extra or {})["roundtrip_timings"]
    assert {"gateway_ms", "queue_ms", "tokenize_ms", "prefill_ms", "ttft_ms", "decode_ms", "total_ms"} <= set(timings)
    row = _usage(reply.id)
    assert (row.status, row.finish_reason, row.prompt_tokens, row.completion_tokens) == (200, "stop", 27, 9)
    assert row.prompt_text == ""  # not stored unless ROUNDTRIP_STORE_PROMPTS


def test_streaming_text_equals_the_non_streamed_answer(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    # type: ignore[arg-type]
    stream = client.chat.completions.create(
        model="smollm2", messages=SEED_QUESTION, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The capital of India is New Delhi."
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 36


def test_logprobs_and_top_logprobs(site_server: Any, make_key: Any) -> None:
    # type: ignore[arg-type]
    reply = sdk(site_server, make_key()).chat.completions.create(
        model="smollm2", messages=SEED_QUESTION, temperature=0, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and "".join(t.token for t in content) == "The capital of India is New Delhi."
    for token in content:
        assert len(token.top_logprobs) == 3
        assert token.top_logprobs[0].token == token.token  # greedy: the chosen token is the most likely
        assert token.logprob <= 0 and bytes(token.bytes or []).decode() == token.token


def test_a_seed_reproduces_a_sampled_answer(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())

    def ask(seed: int) -> str:
        reply = client.chat.completions.create(model="tiny", messages=HI, temperature=1.0, seed=seed, max_tokens=30)  # type: ignore[arg-type]
        return reply.choices[0].message.content or ""

    assert ask(11) == ask(11) != ask(12)


def test_a_stop_string_ends_the_answer_before_it(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    reply = client.chat.completions.create(model="smollm2", messages=SEED_QUESTION, temperature=0, stop=["Delhi"])  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "The capital of India is New "
    assert reply.choices[0].finish_reason == "stop"


def test_max_tokens_ends_with_length(site_server: Any, make_key: Any) -> None:
    # ignore_eos: the tiny random model may otherwise sample an end-of-turn token within 5 tokens (a stop, not a length)
    reply = sdk(site_server, make_key()).chat.completions.create(
        model="tiny",
        messages=HI,
        max_completion_tokens=5,  # type: ignore[arg-type]
        extra_body={"ignore_eos": True},
    )
    assert reply.choices[0].finish_reason == "length" and reply.usage is not None and reply.usage.completion_tokens == 5


def test_models_lists_ids_and_load_status(site_server: Any, make_key: Any) -> None:
    models = sdk(site_server, make_key()).models.list().data
    assert [m.id for m in models] == ["tiny", "smollm2-135m-instruct"]
    status = (models[1].model_extra or {})["status"]
    assert status["state"] == "ready"
    # format and size, as the server holds it
    assert status["weights"].startswith("fp32") and status["weights"].endswith(" MB")


def test_tokenize_matches_llama_cpp(site_server: Any, make_key: Any) -> None:
    r = httpx.post(
        f"{site_server.api}/tokenize",
        json={"model": "smollm2", "text": "What's the capital of India?"},
        headers={"Authorization": f"Bearer {make_key()}"},
    )
    assert r.status_code == 200
    assert r.json()["ids"] == [1780, 506, 260, 3575, 282, 3089, 47]
    assert r.json()["tokens"][3] == " capital"


def test_the_exact_sse_bytes(site_server: Any, make_key: Any) -> None:
    body = {
        "model": "tiny",
        "messages": HI,
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST",
        f"{site_server.api}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {make_key()}"},
        timeout=60,
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_bytes())
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    payloads = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert all(e.startswith(b"data: {") and b"\n" not in e for e in events[:-2])
    assert all(
        p["object"] == "chat.completion.chunk" and p["id"] == payloads[0]["id"] and p["model"] == "tiny"
        for p in payloads
    )
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert payloads[-2]["choices"][0]["finish_reason"] == "length" and payloads[-2]["choices"][0]["delta"] == {}
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize(
    "request_kwargs, exception, code",
    [
        ({"model": "nope"}, openai.NotFoundError, "model_not_found"),
        ({"model": "tiny", "temperature": 3}, openai.BadRequestError, None),
        ({"model": "tiny", "top_logprobs": 2}, openai.BadRequestError, None),
        ({"model": "smollm2", "max_tokens": 9000}, openai.BadRequestError, "context_length_exceeded"),
        ({"model": "tiny", "messages": []}, openai.BadRequestError, None),
    ],
)
def test_bad_requests_raise_the_sdks_matching_error(
    site_server: Any, make_key: Any, request_kwargs: dict[str, Any], exception: type, code: str | None
) -> None:
    kwargs: dict[str, Any] = {"messages": HI, **request_kwargs}
    with pytest.raises(exception) as info:
        sdk(site_server, make_key()).chat.completions.create(**kwargs)
    assert info.value.body["message"]  # type: ignore[attr-defined]
    if code:
        assert info.value.code == code  # type: ignore[attr-defined]


def test_keys_that_cannot_be_used_get_401(site_server: Any, make_key: Any) -> None:
    revoked, expired = (
        make_key(name="revoked"),
        make_key(name="expired", expires_at=timezone.now() - timedelta(seconds=1)),
    )
    ApiKey.objects.get(name="revoked").revoke()
    for key, words in [("rt-unknown", "Incorrect API key"), (revoked, "revoked"), (expired, "expired")]:
        with pytest.raises(openai.AuthenticationError, match=words):
            sdk(site_server, key).chat.completions.create(model="tiny", messages=HI)  # type: ignore[arg-type]
    r = httpx.post(f"{site_server.api}/chat/completions", json={"model": "tiny", "messages": HI})
    assert r.status_code == 401 and "didn't provide an API key" in r.json()["error"]["message"]


def test_a_key_limited_to_some_models_gets_403_for_others(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key(allowed_models=["tiny"]))
    client.chat.completions.create(model="tiny", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="smollm2", messages=HI)  # type: ignore[arg-type]
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_rate_limits_hold_exactly_under_parallel_requests(site_server: Any, make_key: Any) -> None:
    key = make_key(requests_per_minute=5)

    def call(_: int) -> httpx.Response:
        return httpx.post(
            f"{site_server.api}/chat/completions",
            json={"model": "tiny", "messages": HI, "max_tokens": 2},
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )

    clear_of_minute_edge()
    with ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(call, range(12)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 5 + [429] * 7
    refused = next(r for r in responses if r.status_code == 429)
    assert int(refused.headers["retry-after"]) >= 1
    assert (
        refused.headers["x-ratelimit-limit-requests"] == "5"
        and refused.headers["x-ratelimit-remaining-requests"] == "0"
    )
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    ok = next(r for r in responses if r.status_code == 200)
    assert ok.headers["x-ratelimit-limit-requests"] == "5"


def test_a_spent_token_budget_gets_429_insufficient_quota(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key(token_budget=10))
    client.chat.completions.create(model="tiny", messages=HI, max_tokens=3)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=3)  # type: ignore[arg-type]
    assert info.value.code == "insufficient_quota"


def test_the_usage_row_bills_the_tokens_at_the_models_prices(site_server: Any, make_key: Any) -> None:
    reply = sdk(site_server, make_key()).chat.completions.create(model="tiny", messages=HI, max_tokens=3)  # type: ignore[arg-type]
    row = _usage(reply.id)
    per_input, per_output = PRICES["tiny"]
    expected = (row.prompt_tokens * per_input + row.completion_tokens * per_output) / 1e6
    assert row.completion_tokens == 3 and row.cost_usd == pytest.approx(expected, rel=1e-12) and expected > 0


def test_a_spent_dollar_budget_gets_429_insufficient_quota(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key(spend_budget=0.00001))  # tiny: $2 / $8 per million, so about 5 tokens
    client.chat.completions.create(model="tiny", messages=HI, max_tokens=3)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=3)  # type: ignore[arg-type]
    assert info.value.code == "insufficient_quota" and "Spend budget exhausted: $1e-05 per day" in str(info.value)


def test_many_streams_at_once_all_get_their_own_answer(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())

    def ask(seed: int, stream: bool) -> str:
        kwargs: dict[str, Any] = {"model": "tiny", "messages": HI, "temperature": 1.0, "seed": seed, "max_tokens": 60}
        if not stream:
            return client.chat.completions.create(**kwargs).choices[0].message.content or ""
        return "".join(
            c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs) if c.choices
        )

    expected = {seed: ask(seed, stream=False) for seed in range(6)}
    with ThreadPoolExecutor(6) as pool:
        got = dict(zip(range(6), pool.map(lambda s: ask(s, stream=True), range(6))))
    assert got == expected


def test_overload_gets_503_with_retry_after(site_server: Any, make_key: Any) -> None:
    key = make_key()

    def call(_: int) -> httpx.Response:
        body = {"model": "smollm2", "messages": HI, "max_tokens": 20}  # the real model: slow enough to pile up
        return httpx.post(
            f"{site_server.api}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
        )

    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(call, range(16)))
    overloaded = [r for r in responses if r.status_code == 503]
    assert overloaded and all(r.status_code in (200, 503) for r in responses)
    assert overloaded[0].json()["error"]["code"] == "overloaded" and int(overloaded[0].headers["retry-after"]) >= 1


def test_a_client_that_leaves_mid_stream_frees_its_slot_and_leaves_a_usage_row(site_server: Any, make_key: Any) -> None:
    key = make_key(concurrent_streams=1)
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
        "max_tokens": 400,
        "stream": True,
    }
    with httpx.stream(
        "POST",
        f"{site_server.api}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    ) as r:
        request_id = r.headers["x-request-id"]
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
    row = _usage(request_id)
    assert (row.status, row.finish_reason) == (499, "cancelled")
    assert 0 < row.completion_tokens < 400
    # its one concurrent stream is free again (ignore_eos: a sampled end-of-turn cannot end it early)
    # type: ignore[arg-type]
    reply = sdk(site_server, key).chat.completions.create(
        model="tiny", messages=HI, max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert reply.choices[0].finish_reason == "length"


def test_every_request_leaves_a_usage_row_even_when_refused(site_server: Any, make_key: Any) -> None:
    key = make_key()
    before = UsageRecord.objects.count()
    httpx.post(
        f"{site_server.api}/chat/completions",
        json={"model": "nope", "messages": HI},
        headers={"Authorization": f"Bearer {key}"},
    )
    httpx.post(f"{site_server.api}/chat/completions", json={"model": "tiny", "messages": HI})
    deadline = time.monotonic() + 5
    while UsageRecord.objects.count() < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    rows = list(UsageRecord.objects.order_by("-id")[:2])
    assert sorted(r.status for r in rows) == [401, 404]
    assert any(r.api_key is not None and r.error_code == "model_not_found" for r in rows)


@pytest.mark.parametrize(
    "content, headers, status, words",
    [
        (b'{"model": "tiny", "messages": [', {}, 400, "not valid JSON"),
        (b"\xff\xfe{}", {}, 400, "not valid UTF-8"),
        (b"[1, 2]", {}, 400, "JSON object"),
        (json.dumps({"model": "tiny", "messages": HI, "temperature": "hot"}).encode(), {}, 400, "expected a number"),
        (json.dumps({"model": "tiny", "messages": HI, "max_tokens": True}).encode(), {}, 400, "expected an integer"),
        (
            json.dumps({"model": "tiny", "messages": HI, "banana": 1}).encode(),
            {},
            400,
            "Unrecognized request argument supplied: banana",
        ),
        (json.dumps({"model": "tiny", "messages": []}).encode(), {}, 400, "at least one message"),
        (
            json.dumps({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}).encode(),
            {},
            400,
            "messages[0].role",
        ),
        (json.dumps({"model": "tiny", "messages": [{"role": "user"}]}).encode(), {}, 400, "messages[0].content"),
        (json.dumps({"model": "tiny", "messages": HI, "n": 9}).encode(), {}, 400, "between 1 and 8"),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"a" * (2 * 1024 * 1024) + b'"}]}',
            {},
            413,
            "too large",
        ),
        (b"[" * 100000 + b"]" * 100000, {}, 400, "nested too deeply"),
        (b'{"model": "tiny", "messages": [], "max_tokens": ' + b"9" * 5001 + b"}", {}, 400, "too many digits"),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
            {},
            400,
            "NaN is not valid JSON",
        ),
        (
            b'{"model": "tiny", "messages": [{"role": "system", "content": "\\ud800"}, {"role": "user", "content": '
            b'"hi"}]}',
            {},
            400,
            "'messages[0].content' contains a lone UTF-16 surrogate",
        ),
        (
            b'--x\r\nContent-Disposition: form-data; name="model"\r\n\r\ntiny\r\n--x--\r\n',
            {"Content-Type": "multipart/form-data; boundary=x"},
            400,
            "not valid JSON",
        ),
        (
            json.dumps({"model": "tiny", "messages": HI}).encode(),
            {"Authorization": "Bearer " + "a" * 60_000},
            431,
            "the limit is 16,384",
        ),
    ],
)
def test_bad_input_gets_a_clear_4xx_and_the_server_keeps_serving(
    site_server: Any, make_key: Any, content: bytes, headers: dict[str, str], status: int, words: str
) -> None:
    key = make_key()
    r = httpx.post(
        f"{site_server.api}/chat/completions",
        content=content,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json", **headers},
        timeout=60,
    )
    assert r.status_code == status
    error = r.json()["error"]
    assert words in error["message"] and set(error) == {"message", "type", "param", "code"}
    assert _usage(r.headers["x-request-id"]).status == status  # refused, and still logged
    ok = httpx.post(
        f"{site_server.api}/chat/completions",
        json={"model": "tiny", "messages": HI, "max_tokens": 1},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert ok.status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{"X-Padding": "a" * 200_000}, {f"X-Padding-{i}": "a" * 1000 for i in range(200)}],
    ids=["one-long-line", "many-lines"],
)
def test_headers_past_the_transport_limit_get_431_not_a_dropped_connection(
    site_server: Any, headers: dict[str, str]
) -> None:
    r = httpx.post(f"{site_server.api}/chat/completions", json={}, headers=headers, timeout=60)
    assert r.status_code == 431 and r.json()["error"]["code"] == "headers_too_large"


def test_headers_that_pass_the_transport_limit_a_line_at_a_time_get_431_at_once(site_server: Any) -> None:
    """The head arrives in many reads, and the server answers as soon as it passes the limit, without its end."""
    port = int(site_server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        answer = b""
        for i in range(400):  # 400 KB of headers, never ended with a blank line
            try:
                sock.sendall(b"X-Padding-%d: %s\r\n" % (i, b"a" * 1000))
            except OSError:  # refused and closed: the rest is not read
                break
            if i % 20 == 19:
                time.sleep(0.01)
        while data := sock.recv(65536):
            answer += data
    assert answer.startswith(b"HTTP/1.1 431 ") and b'"headers_too_large"' in answer
    assert httpx.get(f"{site_server.url}/health", timeout=10).status_code == 200


def test_the_openapi_description_lists_the_endpoints(site_server: Any) -> None:
    spec = httpx.get(f"{site_server.api}/openapi.json").json()
    assert spec["openapi"].startswith("3.1") and {"/chat/completions", "/models", "/tokenize"} <= set(spec["paths"])


def test_wrong_method_is_405(site_server: Any, make_key: Any) -> None:
    r = httpx.get(f"{site_server.api}/chat/completions", headers={"Authorization": f"Bearer {make_key()}"})
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed" and r.headers["allow"] == "POST"
    assert _usage(r.headers["x-request-id"]).status == 405  # every request leaves a usage row, as the README says


def test_listing_models_leaves_a_usage_row(site_server: Any, make_key: Any) -> None:
    r = httpx.get(f"{site_server.api}/models", headers={"Authorization": f"Bearer {make_key()}"})
    assert r.status_code == 200 and _usage(r.headers["x-request-id"]).endpoint == "models"


def test_the_second_turn_of_a_long_conversation_reuses_the_cached_prefix(
    site_server: Any, make_key: Any, smollm2_pipeline: Any
) -> None:
    """~500 tokens of history: the second turn reports cached_tokens as OpenAI does, and answers as a cold run does."""
    from inference.params import SamplingParams
    from inference.trace import Finished

    client = sdk(site_server, make_key())
    history = " ".join(
        f"Note {i}: the {w} lighthouse keeper logs the weather, the ships and the tides."
        for i, w in enumerate(["north", "south", "east", "west"] * 6)
    )
    first = [
        {"role": "system", "content": "You are a careful assistant. " + history},
        {"role": "user", "content": "What does the keeper log?"},
    ]
    reply = client.chat.completions.create(model="smollm2", messages=first, temperature=0, max_tokens=16)  # type: ignore[arg-type]
    second = first + [
        {"role": "assistant", "content": reply.choices[0].message.content or ""},
        {"role": "user", "content": "And which directions?"},
    ]
    again = client.chat.completions.create(model="smollm2", messages=second, temperature=0, max_tokens=16)  # type: ignore[arg-type]
    usage = again.usage
    assert usage is not None and usage.prompt_tokens > 450
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens is not None
    assert usage.prompt_tokens_details.cached_tokens >= 400  # the whole first turn, in 16-token blocks
    cold = smollm2_pipeline.prepare(second, SamplingParams(temperature=0.0, max_tokens=16))
    finished = [e for e in smollm2_pipeline.stream(cold) if isinstance(e, Finished)][-1]
    assert finished.cached_tokens == 0 and again.choices[0].message.content == finished.text


def test_a_logit_bias_of_minus_100_on_the_greedy_first_token_changes_it(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    # type: ignore[arg-type]
    plain = client.chat.completions.create(
        model="smollm2", messages=SEED_QUESTION, temperature=0, max_tokens=3, logprobs=True
    )
    first = plain.choices[0].logprobs.content[0].token  # type: ignore[union-attr,index]
    first_id = httpx.post(
        f"{site_server.api}/tokenize",
        json={"model": "smollm2", "text": first},
        headers={"Authorization": f"Bearer {make_key()}"},
        timeout=30,
    ).json()["ids"][0]
    biased = client.chat.completions.create(
        model="smollm2",
        messages=SEED_QUESTION,
        temperature=0,
        max_tokens=3,
        logprobs=True,  # type: ignore[arg-type]
        logit_bias={str(first_id): -100},
    )
    assert biased.choices[0].logprobs.content[0].token != first  # type: ignore[union-attr,index]


def test_tokenize_takes_chat_messages_and_detokenize_round_trips(site_server: Any, make_key: Any) -> None:
    headers = {"Authorization": f"Bearer {make_key()}"}
    templated = httpx.post(
        f"{site_server.api}/tokenize",
        json={"model": "smollm2", "messages": SEED_QUESTION},
        headers=headers,
        timeout=30,
    ).json()
    assert templated["count"] == 27 and templated["prompt"].startswith("<|im_start|>system")
    assert [s["kind"] for s in templated["segments"]].count("message") == 1
    text = httpx.post(
        f"{site_server.api}/detokenize",
        json={"model": "smollm2", "tokens": templated["ids"]},
        headers=headers,
        timeout=30,
    ).json()["text"]
    assert text == templated["prompt"]
    plain = httpx.post(
        f"{site_server.api}/tokenize",
        json={"model": "smollm2", "text": "What's the capital of India?"},
        headers=headers,
        timeout=30,
    ).json()
    assert plain["ids"] == [1780, 506, 260, 3575, 282, 3089, 47]
    back = httpx.post(
        f"{site_server.api}/detokenize",
        json={"model": "smollm2", "tokens": plain["ids"]},
        headers=headers,
        timeout=30,
    ).json()
    assert back["text"] == "What's the capital of India?"
    bad = httpx.post(
        f"{site_server.api}/detokenize", json={"model": "smollm2", "tokens": [10**8]}, headers=headers, timeout=30
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    both = httpx.post(
        f"{site_server.api}/tokenize",
        json={"model": "smollm2", "text": "x", "messages": SEED_QUESTION},
        headers=headers,
        timeout=30,
    )
    assert both.status_code == 400


def test_a_ten_thousand_message_request_does_not_hold_up_a_normal_chat(site_server: Any, make_key: Any) -> None:
    key = make_key()
    huge = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}] * 10_000, "max_tokens": 4}
    with ThreadPoolExecutor(1) as pool:
        big = pool.submit(
            httpx.post,
            f"{site_server.api}/chat/completions",
            json=huge,
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        )
        started = time.perf_counter()
        with httpx.stream(
            "POST",
            f"{site_server.api}/chat/completions",
            json={"model": "tiny", "messages": HI, "max_tokens": 8, "stream": True},
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        ) as stream:
            ttft = None
            for line in stream.iter_lines():
                if ttft is None and '"content"' in line:
                    ttft = time.perf_counter() - started
        refused = big.result()
    assert ttft is not None and ttft < 2.0
    # refused at the edge, by count
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages"
