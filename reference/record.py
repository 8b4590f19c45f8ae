"""Record layout shared by all methods (spec/formats.toml `record` lists, spec/streaming.md window).

Field names and order come from formats.toml; every record ends with `window`, the tokens Q..T−1 kept
exactly in the input dtype. Decoders use `geometry` to read B, H, Q, T, d back from the arrays.
"""
from __future__ import annotations

import numpy as np

from .. import spec
from . import numerics

_NP = {"uint32": np.dtype(np.uint32), "float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}


def fields(params: spec.Params) -> list[tuple[str, str]]:
    """[(name, dtype)] in spec order; dtype 'input' means the input dtype."""
    info = spec.method_info(params.method)
    rows = info.get("record") or info[f"record_{params.role}"]
    return [(name, dt) for name, dt, _shape in rows]


def assemble(params: spec.Params, dtype: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The record dict in spec field order, every array contiguous in its stored dtype."""
    out = {}
    for name, dt in fields(params):
        want = numerics.STORAGE[dtype] if dt == "input" else _NP[dt]
        out[name] = np.ascontiguousarray(arrays[name], dtype=want)
    return out


def window_of(x: np.ndarray, q: int) -> np.ndarray:
    """Tokens q..T−1 of the input, exact, in the input dtype's storage."""
    return np.ascontiguousarray(x[:, :, q:])


def geometry(record: dict, params: spec.Params, dtype: str) -> tuple[int, int, int, int, int]:
    """(B, H, Q, T, d) of a record; ValueError naming `record` if a field is missing or mistyped."""
    numerics.check_dtype(dtype)
    if not isinstance(record, dict):
        raise ValueError(f"record: must be a dict of arrays, got {type(record).__name__}")
    for name, dt in fields(params):
        if name not in record:
            raise ValueError(f"record: missing field {name!r} for method {params.method}")
        want = numerics.STORAGE[dtype] if dt == "input" else _NP[dt]
        if np.asarray(record[name]).dtype != want:
            raise ValueError(f"record: field {name!r} has dtype {np.asarray(record[name]).dtype}, expected {want}")
    win = record["window"]
    if win.ndim != 4:
        raise ValueError(f"record: window must have rank 4, got shape {win.shape}")
    b, h, tw, d = win.shape
    first = fields(params)[0][0]
    q = record[first].shape[2]
    if record[first].shape[:2] != (b, h):
        raise ValueError(f"record: {first!r} shape {record[first].shape} disagrees with window {win.shape}")
    return b, h, q, q + tw, d


def with_window(decoded_prefix: np.ndarray, record: dict, dtype: str) -> np.ndarray:
    """All T tokens as binary32: the decoded prefix, then the window's exact upcast."""
    return np.concatenate([decoded_prefix.astype(np.float32, copy=False),
                           numerics.upcast(record["window"], dtype)], axis=2)
