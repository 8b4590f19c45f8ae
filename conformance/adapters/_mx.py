"""numpy <-> mx conversions for the MLX adapters (bfloat16 travels as uint16 bit patterns)."""
from __future__ import annotations

import numpy as np


def to_mx(a: np.ndarray, dtype: str | None = None):
    """numpy -> mx.array, exact. `dtype == "bfloat16"` marks uint16 bit patterns to view as bf16."""
    import mlx.core as mx
    a = np.ascontiguousarray(a)
    if dtype == "bfloat16" and a.dtype == np.uint16:
        return mx.array(a).view(mx.bfloat16)
    if a.dtype == np.float64:
        # mx.array converts float64 to float32 silently; keep it float64 so a wrong dtype stays wrong
        return mx.array(a, dtype=mx.float64)
    return mx.array(a)


def to_np(a) -> np.ndarray:
    """mx.array -> numpy, exact; bfloat16 comes back as uint16 bit patterns."""
    import mlx.core as mx
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    return np.array(a, copy=True)


def record_to_np(rec) -> dict[str, np.ndarray]:
    return {k: to_np(v) for k, v in rec.items()}


def record_to_mx(rec: dict[str, np.ndarray], dtype: str):
    # only "input"-dtype fields are uint16 in the interchange, and only when dtype is bfloat16
    return {k: to_mx(v, dtype) for k, v in rec.items()}


_BF16 = "__mx_bfloat16__"
_MX = "__mx__"


def tree_to_np(t):
    """A saved state as plain numpy (a real copy, as if written to disk); mx arrays are tagged."""
    import mlx.core as mx
    if isinstance(t, mx.array):
        return (_BF16 if t.dtype == mx.bfloat16 else _MX, to_np(t))
    if isinstance(t, dict):
        return {k: tree_to_np(v) for k, v in t.items()}
    if isinstance(t, (list, tuple)):
        return type(t)(tree_to_np(v) for v in t)
    if isinstance(t, np.ndarray):
        return t.copy()
    return t


def tree_to_mx(t):
    import mlx.core as mx
    if isinstance(t, tuple) and len(t) == 2 and t[0] in (_BF16, _MX) and isinstance(t[1], np.ndarray):
        a = mx.array(t[1])
        return a.view(mx.bfloat16) if t[0] == _BF16 else a
    if isinstance(t, dict):
        return {k: tree_to_mx(v) for k, v in t.items()}
    if isinstance(t, (list, tuple)):
        return type(t)(tree_to_mx(v) for v in t)
    return t
