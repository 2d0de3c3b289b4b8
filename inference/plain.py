"""Turning nested results into plain JSON-safe values (dicts, lists, str, int, float, bool, None).

Shared by the weights cache (GGUF metadata) and the trace serializer, so msgpack (Redis)
and JSON both carry what they produce.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

_PLAIN = (str, int, float, bool)


def to_plain(value: Any, decimals: int = 4) -> Any:
    """Recursively: dataclass instances become dicts of their fields, numpy scalars Python numbers, arrays rounded
    lists, bytes lists of ints. (One pass, not `dataclasses.asdict` first: that deep-copied every event a second time,
    a third of the cost of serializing a decode step's events.)"""
    if value is None or type(value) in _PLAIN:
        # most leaves: nothing to convert (exact types: numpy's float64 is a float)
        return value
    if isinstance(value, dict):
        return {k: to_plain(v, decimals) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v, decimals) for v in value]
    if isinstance(value, np.ndarray):
        return np.round(value.astype(np.float64), decimals).tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name), decimals) for f in dataclasses.fields(value)}
    return value
