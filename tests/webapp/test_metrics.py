"""Prometheus metrics: vLLM's names, who may read them, the numbers after real requests, and the shipped dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from django.test import Client, override_settings
from prometheus_client import REGISTRY
from servers import metric_samples as samples
from servers import metric_value as value

import webapp.metrics.metrics  # noqa: F401  (registers every metric)

DASHBOARD = Path(__file__).resolve().parents[2] / "webapp" / "metrics" / "grafana" / "roundtrip.json"
REQUIRED = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "roundtrip_gateway_requests_total",
    "roundtrip_gateway_refused_total",
    "roundtrip_prefix_cache_bytes",
]
SUFFIXES = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_sum", "_count", "_created"], "gauge": [""]}


def exported_names() -> set[str]:
    names = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, [""]))
    return names


def test_the_engine_metrics_have_vllms_names() -> None:
    assert set(REQUIRED) <= exported_names()


def test_the_dashboard_queries_only_exported_names() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"\b(vllm:[a-z0-9_:]+|roundtrip_[a-z0-9_]+)\b", e)}
    assert used and used <= exported_names(), used - exported_names()
    assert {n.removesuffix("_total") for n in REQUIRED} <= {
        n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count").removesuffix("_total") for n in used
    }


@pytest.mark.django_db
def test_metrics_are_open_on_loopback_only_by_default() -> None:
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="::1").get("/metrics").status_code == 200
    refused = Client(REMOTE_ADDR="203.0.113.9").get("/metrics")
    assert refused.status_code == 403 and "ROUNDTRIP_METRICS_TOKEN" in refused.json()["error"]["message"]


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP"])
def test_a_request_a_proxy_passed_on_is_not_loopback_whatever_the_proxy_says(header: str) -> None:
    """Behind a reverse proxy on this machine every visitor arrives from loopback: its forwarding header says so."""
    refused = Client(REMOTE_ADDR="127.0.0.1").get("/metrics", **{header: "127.0.0.1"})
    assert refused.status_code == 403


@pytest.mark.django_db
@override_settings(ROUNDTRIP_TRUSTED_PROXIES=["127.0.0.1"])
def test_a_proxy_that_adds_no_header_is_not_this_machine_when_it_is_named() -> None:
    """A TCP proxy on this machine passes visitors on from loopback without a header: naming it as the deployment's
    proxy (as its visitors' addresses need anyway) closes /metrics to it."""
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 403
    assert Client(REMOTE_ADDR="::1").get("/metrics").status_code == 200  # not the proxy: this machine


@pytest.mark.django_db
@override_settings(ROUNDTRIP_METRICS_TOKEN="s3cret")
def test_with_a_token_set_every_client_needs_it() -> None:
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 403
    assert Client(REMOTE_ADDR="203.0.113.9").get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    ok = Client(REMOTE_ADDR="203.0.113.9").get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert ok.status_code == 200 and "vllm:num_requests_running" in ok.content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_live_server_counts_requests_tokens_and_refusals(site_server: Any, make_key: Any) -> None:
    before = samples(site_server.url)
    key = make_key()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7, "ignore_eos": True}
    assert (
        httpx.post(
            f"{site_server.api}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
        ).status_code
        == 200
    )
    assert (
        httpx.post(
            f"{site_server.api}/chat/completions", json=body, headers={"Authorization": "Bearer rt-nope"}, timeout=60
        ).status_code
        == 401
    )
    after = samples(site_server.url)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("vllm:generation_tokens_total", model_name="tiny") == 7
    assert grew("vllm:request_success_total", model_name="tiny", finished_reason="length") == 1
    assert grew("vllm:time_to_first_token_seconds_count", model_name="tiny") == 1
    assert grew("vllm:inter_token_latency_seconds_count", model_name="tiny") == 6
    assert (
        grew("roundtrip_step_delivery_seconds_count", model_name="tiny")
        == grew("roundtrip_step_seconds_count", model_name="tiny")
        >= 7
    )
    assert grew("roundtrip_step_delivery_seconds_sum", model_name="tiny") > 0
    assert grew("vllm:prefix_cache_queries_total", model_name="tiny") > 0
    assert grew("roundtrip_gateway_requests_total", endpoint="chat.completions", status="200") == 1
    assert grew("roundtrip_gateway_refused_total", endpoint="chat.completions", reason="invalid_api_key") == 1
    assert value(after, "vllm:num_requests_running", model_name="tiny") == 0
    assert value(after, "roundtrip_workers_alive") == 1
