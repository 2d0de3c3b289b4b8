"""Settings from the environment: defaults that just work, and loud failures for values that make no sense."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from inference.load_config import LoadConfig, default_cache_dir


class ImproperlyConfiguredEnv(ValueError):
    """An environment variable is set to something its setting cannot use."""


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def persisted_secret(name: str, path: os.PathLike[str] | str) -> str:
    """The variable `name` when set; else a random secret kept in `path` (created once, readable by its owner only),
    so the embedded default is never run with a published key and sessions survive a restart."""
    given = os.environ.get(name)
    if given:
        return given
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with open(path) as existing:
            return existing.read().strip()
    secret = secrets.token_urlsafe(50)
    with os.fdopen(fd, "w") as new:
        new.write(secret)
    return secret


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not an integer") from None


def env_float(name: str, default: float, minimum: float = 0.0) -> float:
    """A number of at least `minimum`."""
    value = env_float_or_off(name, default, minimum)
    if value is None:
        raise ImproperlyConfiguredEnv(f"{name}=off: a number is needed here")
    return value


def env_float_or_off(name: str, default: float | None, minimum: float) -> float | None:
    """A number of at least `minimum`, or `off` (None): a bound an operator may lift."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.strip().lower() == "off":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not a number (or off)") from None
    if not value >= minimum:  # also refuses nan
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} must be at least {minimum} (or off)")
    return value


_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def env_bytes(name: str, default: int) -> int:
    """A size in bytes: `2147483648`, `512M`, `2G` or `2GiB` (binary units)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    text = raw.strip().lower().removesuffix("ib").removesuffix("b")
    number, unit = (text[:-1], text[-1]) if text and text[-1] in _UNITS else (text, "")
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise ImproperlyConfiguredEnv(
            f"{name}={raw!r} is not a size (use bytes, or a number with K, M, G or T)"
        ) from None
    if value < 0:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} must not be negative")
    return int(value)


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_json(name: str, default: Any) -> Any:
    """A JSON value; invalid JSON stops the start with the variable named."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ImproperlyConfiguredEnv(f"{name} is not valid JSON: {exc}") from None


def database_from_url(url: str) -> dict[str, Any]:
    """A Django DATABASES entry from `postgres://user:pass@host:port/name` or `sqlite:///path`."""
    parsed = urlparse(url)
    if parsed.scheme in ("postgres", "postgresql"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": parsed.path.lstrip("/"),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
        }
    if parsed.scheme == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": parsed.path}
    raise ImproperlyConfiguredEnv(f"DATABASE_URL scheme {parsed.scheme!r} is not supported (postgres:// or sqlite:///)")


def load_config(prefix: str = "ROUNDTRIP_") -> LoadConfig:
    """How models load (`inference.load_config`), from `<prefix>DEVICE`, `<prefix>WEIGHTS`, `<prefix>KV_CACHE`,
    `<prefix>CPU_KERNELS`, `<prefix>Q4_ACTIVATIONS`, `<prefix>INT4_GEMM` and `<prefix>CACHE_DIR`; a value outside its
    choices stops the start, naming the variable."""
    config = LoadConfig(
        device=env_str(f"{prefix}DEVICE", "") or None,
        weights=env_str(f"{prefix}WEIGHTS", "auto"),
        kv_cache=env_str(f"{prefix}KV_CACHE", "auto"),
        cpu_kernels=env_str(f"{prefix}CPU_KERNELS", "auto"),
        q4_activations=env_str(f"{prefix}Q4_ACTIVATIONS", "int8"),
        int4_gemm=env_str(f"{prefix}INT4_GEMM", "auto"),
        cache_dir=Path(env_str(f"{prefix}CACHE_DIR", "") or default_cache_dir()),
    )
    try:
        config.validate()
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(str(exc)) from None
    return config
