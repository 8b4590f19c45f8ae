"""numpy reference implementation of spec v1 (spec/README.md): the spec made executable.

One module per method (spec/methods/<name>.md) with `encode(x, params, dtype) -> record` and
`decode(record, params, dtype) -> float32 (B, H, T, d)`; `reference.encode` / `reference.decode`
dispatch on `params.method`. Streaming semantics live in `reference.stream.Stream`.
"""
from __future__ import annotations

import importlib

from .. import spec

# method name -> its module, every method of spec.METHODS (an import error is an error, not a missing method)
METHODS: dict = {name: importlib.import_module(f"{__name__}.{name}") for name in spec.METHODS}


def method_module(params: spec.Params):
    spec.method_info(params.method)  # ValueError naming `method` for an unknown name
    return METHODS[params.method]


def encode(x, params: spec.Params, dtype: str) -> dict:
    return method_module(params).encode(x, params, dtype)


def decode(record: dict, params: spec.Params, dtype: str):
    return method_module(params).decode(record, params, dtype)
