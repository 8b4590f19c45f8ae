"""MLX ops for every method of the spec: `encode(x, params)` / `decode(record, params)` dispatch on
params.method. Modules: numerics, prng, rotation, codebooks, packing (shared ops, one chapter each),
record (record layout and the one-shot frame), and one module per method (spec/methods/)."""
from __future__ import annotations

import importlib

import mlx.core as mx

from ... import spec
from . import record

METHODS = spec.METHODS


def method_module(method: str):
    """The module of a method; ValueError naming `method` if unknown."""
    if method not in METHODS:
        raise ValueError(f"method: unknown method {method!r}")
    return importlib.import_module(f"veloxquant.accelerated.ops.{method}")


def encode(x: mx.array, params: spec.Params, dtype=None) -> dict[str, mx.array]:
    """One-shot encode of x (B, H, T, d): the record of spec/formats.toml (window in x's dtype).
    `dtype` (optional, a name or mx dtype) is the declared input dtype; x must have it (else ValueError x)."""
    p = record.resolve(params)
    return method_module(p.method).encode(x, p, dtype)


def decode(rec: dict[str, mx.array], params: spec.Params, dtype=None) -> mx.array:
    """Decode a record to float32 (B, H, T, d): encoded prefix, then the window upcast."""
    p = record.resolve(params)
    return method_module(p.method).decode(rec, p, dtype)
