"""A cache of dequantized weights and parsed metadata, so the second start skips GGUF parsing.

Keyed by the file's real path, size and modification time: replacing the file misses the
cache. Entries are written to a temporary folder and renamed into place, so a crash never
leaves a half-written entry that a later start would trust.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

CACHE_FORMAT = 1


def cache_dir() -> Path:
    """`ROUNDTRIP_CACHE_DIR`, else `~/.cache/roundtrip/models`."""
    configured = os.environ.get("ROUNDTRIP_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "roundtrip" / "models"


def entry_for(model_path: str) -> Path:
    stat = os.stat(model_path)
    key = f"{os.path.realpath(model_path)}|{stat.st_size}|{stat.st_mtime_ns}|{CACHE_FORMAT}"
    return cache_dir() / hashlib.sha256(key.encode()).hexdigest()[:24]


def load(model_path: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """(metadata, float32 state dict) from the cache, or None on a miss or an unreadable entry."""
    entry = entry_for(model_path)
    try:
        meta = json.loads((entry / "meta.json").read_text())
        weights = torch.load(entry / "weights.pt", mmap=True, weights_only=True)
    except (OSError, ValueError, RuntimeError):
        return None
    return meta, weights


def store(model_path: str, meta: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
    """Write an entry; failures (read-only home, full disk) only cost the next start its speed."""
    entry = entry_for(model_path)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-"))
    except OSError:
        return
    try:
        (tmp / "meta.json").write_text(json.dumps(meta))
        torch.save(weights, tmp / "weights.pt")
        if entry.exists():
            shutil.rmtree(entry)
        tmp.rename(entry)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
