"""Codebook tables scaled to head dim d, and quantization by counting strict crossings (spec/codebooks.md).

Scaled tables are setup (cached per (table, d)); quantize/dequantize run per token.
"""
from __future__ import annotations

import functools

import mlx.core as mx

from ... import spec
from . import numerics


def _scaled(cb: spec.Codebook, d: int) -> tuple[mx.array, mx.array]:
    s = numerics.scale(d)
    c = mx.array(cb.centroids, dtype=mx.float32) * s   # C_d[i] = C[i] * s_d, one multiply each
    b = mx.array(cb.boundaries, dtype=mx.float32) * s
    mx.eval(c, b)
    return c, b


@functools.lru_cache(maxsize=None)
def gaussian(bits: int, d: int) -> tuple[mx.array, mx.array]:
    """(C_d, B_d) of gaussian[bits]."""
    return _scaled(spec.gaussian(bits), d)


@functools.lru_cache(maxsize=None)
def residual(bits: int, bits2: int, d: int) -> tuple[mx.array, mx.array]:
    """(C2_d, B2_d) of residual[bits][bits2]."""
    return _scaled(spec.residual(bits, bits2), d)


def quantize(u: mx.array, boundaries, d: int | None = None) -> mx.array:
    """Index = number of boundaries strictly below u (ties go to the lower index); uint32.

    `boundaries` is B_d (mx array), or a spec.Codebook plus d (scaled here; for conformance probes).
    An integer sum of 0/1 values is exact in any order, so mx.sum is fine here.
    """
    if isinstance(boundaries, spec.Codebook):
        boundaries = _scaled(boundaries, d)[1]
    return (u[..., None] > boundaries).astype(mx.uint32).sum(axis=-1)


def dequantize(i: mx.array, centroids, d: int | None = None) -> mx.array:
    """C_d[i]; `centroids` is C_d (mx array) or a spec.Codebook plus d."""
    if isinstance(centroids, spec.Codebook):
        centroids = _scaled(centroids, d)[0]
    return mx.take(centroids, i.astype(mx.uint32))
