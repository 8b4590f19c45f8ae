"""numpy reference implementation of spec v1 (spec/README.md): the spec made executable.

One module per method (spec/methods/<name>.md) with `encode(x, params, dtype) -> record` and
`decode(record, params, dtype) -> float32 (B, H, T, d)`; `reference.encode` / `reference.decode`
dispatch on `params.method`. Streaming semantics live in `reference.stream.Stream`.
"""
from __future__ import annotations

import importlib

import spec

_NAMES = ("turboquant", "turboquant_rvq", "turboquant_prod", "kivi", "rabitq", "mlx_affine")


def _load() -> dict:
    out = {}
    for name in _NAMES:
        try:
            out[name] = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:  # a method whose module is not written yet
            if e.name != f"{__name__}.{name}":
                raise
    return out


METHODS: dict = _load()


def method_module(params: spec.Params):
    spec.method_info(params.method)  # ValueError naming `method` for an unknown name
    if params.method not in METHODS:
        raise ValueError(f"method: {params.method!r} has no reference implementation yet")
    return METHODS[params.method]


def encode(x, params: spec.Params, dtype: str) -> dict:
    return method_module(params).encode(x, params, dtype)


def decode(record: dict, params: spec.Params, dtype: str):
    return method_module(params).decode(record, params, dtype)
