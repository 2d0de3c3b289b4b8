"""A cache of parsed metadata and of weights already converted to their format, so a restart skips both.

Keyed by the file's real path, size and modification time (replacing the file misses the
cache); weights additionally by their format plan, the torch version and the CPU's vector
extensions, since packed layouts belong to the kernel that reads them. Loaded weights are
memory-mapped, so a restart costs little time and no copy. Entries are written to a
temporary file and renamed into place, so a crash never leaves a half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

CACHE_FORMAT = 9  # bump when the stored layout changes (`ModelWeights.state`) or what is stored for a plan does
# (9: an AVX2 CPU keeps a file's 5- to 8-bit blocks as they are, where 8 rounded them to 4 bits)


def entry_for(cache_dir: Path, model_path: str) -> Path:
    """The folder in `cache_dir` (`LoadConfig.cache_dir`) of this version of this file."""
    stat = os.stat(model_path)
    key = f"{os.path.realpath(model_path)}|{stat.st_size}|{stat.st_mtime_ns}|{CACHE_FORMAT}"
    return cache_dir / hashlib.sha256(key.encode()).hexdigest()[:24]


def _weights_file(cache_dir: Path, model_path: str, plan_key: str) -> Path:
    build = f"{torch.__version__}|{torch.backends.cpu.get_cpu_capability()}"
    tag = re.sub(r"[^a-z0-9]+", "-", plan_key)
    return entry_for(cache_dir, model_path) / f"weights-{tag}-{hashlib.sha256(build.encode()).hexdigest()[:8]}.pt"


def load_meta(cache_dir: Path, model_path: str) -> dict[str, Any] | None:
    try:
        meta: dict[str, Any] = json.loads((entry_for(cache_dir, model_path) / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta


def store_meta(cache_dir: Path, model_path: str, meta: dict[str, Any]) -> None:
    _write(entry_for(cache_dir, model_path) / "meta.json", lambda f: f.write(json.dumps(meta).encode()))


def load_weights(cache_dir: Path, model_path: str, plan_key: str) -> dict[str, Any] | None:
    """The weights' state (see `ModelWeights.state`), memory-mapped; None on a miss or an unreadable entry."""
    try:
        state: dict[str, Any] = torch.load(_weights_file(cache_dir, model_path, plan_key), mmap=True, weights_only=True)
    except (OSError, ValueError, RuntimeError):
        return None
    return state if state.get("plan") == plan_key else None


def store_weights(cache_dir: Path, model_path: str, plan_key: str, state: dict[str, Any]) -> None:
    _write(_weights_file(cache_dir, model_path, plan_key), lambda f: torch.save(state, f))


def _write(path: Path, write: Any) -> None:
    """Write atomically; failures (read-only home, full disk) only cost the next start its speed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
