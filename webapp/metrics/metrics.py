"""Every Prometheus metric Roundtrip exports, defined once (prometheus_client's default registry).

Engine metrics use vLLM's names where the meaning is the same, so dashboards and alerts
written for vLLM work here; they are updated by the inference worker (`webapp.worker`),
in whatever process it runs. Gateway counters are updated by the web process that
answered the request. Each process exports its own numbers (see `webapp.metrics.views`
and the README on scraping); Prometheus sums them.
"""

from __future__ import annotations

import functools
from typing import TypeVar

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound=MetricWrapperBase)


@functools.lru_cache(maxsize=4096)
def labelled(metric: M, *values: str) -> M:
    """`metric.labels(*values)`, looked up once: prometheus_client checks the values, takes a lock and builds a key
    on every `labels` call (about 10 us), and an upstream request's way to its first token made nine of them."""
    return metric.labels(*values)


MODEL = ["model_name"]
_LATENCY = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
_ITL = (
    0.005,
    0.01,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
)
_REQUEST = (
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
)

# --- the engine (vLLM's names) -------------------------------------------------------------------
num_requests_running = Gauge("vllm:num_requests_running", "Requests in the running batch.", MODEL)
num_requests_waiting = Gauge("vllm:num_requests_waiting", "Requests waiting for a slot in the batch.", MODEL)
kv_cache_usage_perc = Gauge(
    "vllm:kv_cache_usage_perc",
    "KV cache allocated for running requests, as a fraction of the budget (1 = full).",
    MODEL,
)
prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of admitted requests.", MODEL)
generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", MODEL)
request_success = Counter(
    "vllm:request_success", "Requests that left the engine, by why they ended.", MODEL + ["finished_reason"]
)
prefix_cache_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", MODEL)
prefix_cache_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", MODEL)
prefix_cache_bytes = Gauge(
    "roundtrip_prefix_cache_bytes",
    "Keys and values the prefix cache holds (up to ROUNDTRIP_PREFIX_CACHE_BYTES).",
    MODEL,
)
time_to_first_token = Histogram(
    "vllm:time_to_first_token_seconds", "From arrival at the worker to the first token.", MODEL, buckets=_LATENCY
)
inter_token_latency = Histogram(
    "vllm:inter_token_latency_seconds", "Between consecutive tokens of a request.", MODEL, buckets=_ITL
)
e2e_request_latency = Histogram(
    "vllm:e2e_request_latency_seconds", "From arrival at the worker to the last token.", MODEL, buckets=_REQUEST
)
request_queue_time = Histogram(
    "vllm:request_queue_time_seconds", "Waiting for a slot in the batch.", MODEL, buckets=_REQUEST
)
request_prefill_time = Histogram(
    "vllm:request_prefill_time_seconds",
    "From the first prompt chunk's forward to the last one's end.",
    MODEL,
    buckets=_REQUEST,
)
request_decode_time = Histogram(
    "vllm:request_decode_time_seconds", "From the first token to the last.", MODEL, buckets=_REQUEST
)

# --- Roundtrip's own -----------------------------------------------------------------------------
batch_size = Histogram(
    "roundtrip_batch_size", "Sequences in one batched forward.", MODEL, buckets=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
)
step_seconds = Histogram(
    "roundtrip_step_seconds",
    "One engine step: the batched forward, sampling every row and the scheduler's bookkeeping (not the delivery of its "
    "tokens).",
    MODEL,
    buckets=_ITL,
)
step_delivery_seconds = Histogram(
    "roundtrip_step_delivery_seconds",
    "After an engine step: its tokens serialized and sent on by the web side (the scheduler's deferred bookkeeping "
    "runs meanwhile). The engine waits for it, so it is part of every stream's gap between tokens.",
    MODEL,
    buckets=_ITL,
)
gateway_requests = Counter(
    "roundtrip_gateway_requests", "Requests the gateway answered, by endpoint and HTTP status.", ["endpoint", "status"]
)
gateway_refused = Counter(
    "roundtrip_gateway_refused", "Requests refused or failed, by reason (the error code).", ["endpoint", "reason"]
)
workers_alive = Gauge(
    "roundtrip_workers_alive", "Inference workers with a fresh heartbeat, as this web process sees them."
)

# --- upstream servers (labelled by the server: "<model id>@host:port") -----------------------------------------------
UPSTREAM = ["upstream"]
_GATEWAY = (0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5)
upstream_requests = Counter(
    "roundtrip_upstream_requests",
    "Requests an upstream server took, by how they ended (ok, error, cancelled).",
    UPSTREAM + ["outcome"],
)
upstream_failures = Counter(
    "roundtrip_upstream_failures",
    "Upstream failures, by kind: before the first byte (refused, timeout, status) or mid-stream, or a missed probe.",
    UPSTREAM + ["reason"],
)
upstream_retries = Counter(
    "roundtrip_upstream_retries",
    "Requests sent on to another server after this one failed before the first byte.",
    UPSTREAM,
)
upstream_up = Gauge("roundtrip_upstream_up", "1 while the server is in rotation, 0 while it is left out.", UPSTREAM)
upstream_in_flight = Gauge("roundtrip_upstream_in_flight", "Requests open on the server now.", UPSTREAM)
upstream_ttft = Histogram(
    "roundtrip_upstream_time_to_first_token_seconds",
    "The upstream's time to first token, as the gateway saw it (request out to first token in).",
    UPSTREAM,
    buckets=_LATENCY,
)
upstream_itl = Histogram(
    "roundtrip_upstream_inter_token_latency_seconds",
    "Gaps between the upstream's chunks with text, as the gateway saw them.",
    UPSTREAM,
    buckets=_ITL,
)
upstream_gateway_request = Histogram(
    "roundtrip_upstream_gateway_request_seconds",
    "The gateway's own time before the upstream is asked: request in to upstream request out.",
    UPSTREAM,
    buckets=_GATEWAY,
)
upstream_gateway_chunk = Histogram(
    "roundtrip_upstream_gateway_chunk_seconds",
    "The gateway's own time per chunk (a request's mean): upstream chunk in to client chunk out.",
    UPSTREAM,
    buckets=_GATEWAY,
)
