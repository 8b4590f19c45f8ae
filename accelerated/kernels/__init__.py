"""Fused GPU kernels (CUDA and Metal from one body per kernel) for every method of the spec: turboquant,
turboquant_rvq, rabitq, turboquant_prod, kivi, mlx_affine. Bit-exact with accelerated.ops and the spec
(spec/number-model.md: one binary32 op per step, no contraction, halving-fold reductions, strict-crossing
quantization, RNE to float16 / the input dtype where a method stores it).

API mirrors accelerated.ops: `available() -> (bool, reason)`, `encode(x, params, dtype=None)`,
`decode(record, params, dtype=None)`, `method_module(method)`. The encode kernel also checks x for NaN/Inf
and applies the method's rule (norm overflow, KIVI float16 overflow, mlx_affine span overflow) in the same
pass; the flags go to accelerated.ops.numerics.fault (raise now, or recorded inside deferred_checks()).
On the CPU there are no kernels: encode/decode raise RuntimeError with the reason
(accelerated.stream.Stream's default use_kernels="auto" then simply uses accelerated.ops).

Modules: source (kernel bodies + per-backend preludes), backend (backend choice, compiled kernels),
methods (the per-method wrappers around the kernels).
"""
from __future__ import annotations

import mlx.core as mx

from ... import spec
from .. import ops
from . import methods
from .backend import available
from .source import METHOD_IDS
from ..ops import record

KERNEL_METHODS = tuple(METHOD_IDS)


def method_module(method: str):
    """The kernel method object (same interface as an accelerated.ops method module, plus `encode_chunk` and
    `encode_launch`) of `method`. ValueError naming `method` if unknown."""
    ops.method_module(method)   # the same ValueError as accelerated.ops for an unknown method
    return methods.method(method)


def _require() -> None:
    ok, why = available()
    if not ok:
        raise RuntimeError(f"accelerated.kernels: {why}")


def encode(x: mx.array, params: spec.Params, dtype=None) -> dict[str, mx.array]:
    """One-shot encode of x (B, H, T, d): the record of spec/formats.toml, the same bytes as accelerated.ops."""
    _require()
    p = record.resolve(params)
    return method_module(p.method).encode(x, p, dtype)


def decode(rec: dict[str, mx.array], params: spec.Params, dtype=None) -> mx.array:
    """Decode a record to float32 (B, H, T, d), the same bits as accelerated.ops."""
    _require()
    p = record.resolve(params)
    return method_module(p.method).decode(rec, p, dtype)


__all__ = ["available", "encode", "decode", "method_module", "KERNEL_METHODS"]
