"""Fused GPU kernels (CUDA and Metal from one body per kernel) for the rotation family: turboquant,
turboquant_rvq, rabitq, turboquant_prod. Bit-exact with accelerated.ops and the spec (spec/number-model.md:
one binary32 op per step, no contraction, halving-fold reductions, strict-crossing quantization).

API mirrors accelerated.ops: `available() -> (bool, reason)`, `encode(x, params, dtype=None)`,
`decode(record, params, dtype=None)`, `method_module(method)`. Methods without a kernel (kivi, mlx_affine)
run accelerated.ops. On the CPU there are no kernels: encode/decode raise RuntimeError with the reason
(accelerated.stream.Stream's default use_kernels="auto" then simply uses accelerated.ops).

Modules: source (kernel bodies + per-backend preludes), backend (backend choice, compiled kernels),
methods (the per-method wrappers around the kernels).
"""
from __future__ import annotations

import mlx.core as mx

import spec
from accelerated import ops
from accelerated.kernels.backend import available
from accelerated.kernels.source import METHOD_IDS
from accelerated.ops import record

KERNEL_METHODS = tuple(METHOD_IDS)


def method_module(method: str):
    """The kernel method object (same interface as an accelerated.ops method module) for the rotation
    family, accelerated.ops's own module for the others. ValueError naming `method` if unknown."""
    mod = ops.method_module(method)
    if method in METHOD_IDS:
        from accelerated.kernels import methods
        return methods.method(method)
    return mod


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
