"""Randomized Hadamard transform and its inverse (spec/rotation.md).

H, for d = m * n (n = 2^k, m in 1, 12, 20, 28): stage A, the unnormalized Walsh-Hadamard butterfly with
ascending stages on each block of n; stage B (m > 1), the m x m matrix H_m across the blocks, summed left
to right from +0. The inverse uses Hᵀ (H_20 and H_28 are not symmetric). The scale s_d is a separate
multiply after all stages.

`mx.hadamard_transform(v, scale=1.0)` computes H; it is used only on devices where it was verified bitwise
equal to the explicit form below (tests/test_accelerated_ops.py checks it on CPU for every head dim), and
for Hᵀ only where Hᵀ = H (m = 1, 12); elsewhere the explicit form runs.
"""
from __future__ import annotations

import functools
import os

import mlx.core as mx

from ... import spec
from . import numerics

# Device types on which mx.hadamard_transform(scale=1.0) equals `explicit` bit for bit (verified).
BUILTIN_VERIFIED = {mx.DeviceType.cpu}
# VELOXQUANT_EXPLICIT_HADAMARD=1 forces the explicit form everywhere (testing, unverified devices).
_FORCE_EXPLICIT = os.environ.get("VELOXQUANT_EXPLICIT_HADAMARD", "") not in ("", "0")


def butterfly(v: mx.array) -> mx.array:
    """Stage A over the last axis (a power-of-two length n): stage h pairs v[i] and v[i+h] in groups of
    2h (a+b, a-b)."""
    n = v.shape[-1]
    lead = v.shape[:-1]
    h = 1
    while h < n:
        w = v.reshape(*lead, n // (2 * h), 2, h)
        a = w[..., 0, :]
        b = w[..., 1, :]
        v = mx.stack([a + b, a - b], axis=-2).reshape(*lead, n)
        h *= 2
    return v


@functools.lru_cache(maxsize=None)
def _columns(m: int, transpose: bool) -> tuple[mx.array, ...]:
    """Column k of H_m (of H_mᵀ) as an (m, 1) float32 array of +-1, one per k."""
    hm = spec.hadamard_matrix(m)
    if transpose:
        hm = hm.T
    cols = tuple(mx.array(hm[:, k].reshape(m, 1)) for k in range(m))
    mx.eval(*cols)
    return cols


@functools.lru_cache(maxsize=None)
def _symmetric(m: int) -> bool:
    """Hᵀ = H for this radix (H_1 and Sylvester stages always; H_12 of the spec is symmetric too)."""
    hm = spec.hadamard_matrix(m)
    return bool((hm == hm.T).all())


def explicit(v: mx.array, transpose: bool = False) -> mx.array:
    """H(v) (Hᵀ(v)) over the last axis by the spec's two stages. Stage B adds (±1) * w_k to the running
    sums: the sign flip is exact and acc + (-w) is acc - w bit for bit (IEEE subtraction)."""
    d = v.shape[-1]
    lead = v.shape[:-1]
    m, n = spec.split_head_dim(d)
    w = butterfly(v.reshape(*lead, m, n))
    if m == 1:
        return w.reshape(*lead, d)
    acc = mx.zeros((*lead, m, n), dtype=mx.float32)     # every output starts at +0
    for k, col in enumerate(_columns(m, transpose)):
        acc = acc + col * w[..., k:k + 1, :]
    return acc.reshape(*lead, d)


def hadamard(v: mx.array, transpose: bool = False) -> mx.array:
    """H(v) (Hᵀ(v) if transpose) over the last axis, float32."""
    if v.size == 0:  # mx.hadamard_transform rejects empty arrays (e.g. T <= window: nothing encoded)
        return v
    if (not _FORCE_EXPLICIT and mx.default_device().type in BUILTIN_VERIFIED
            and (not transpose or _symmetric(spec.split_head_dim(v.shape[-1])[0]))):
        return mx.hadamard_transform(v, scale=1.0)
    return explicit(v, transpose)


def rht(x32: mx.array, sigma: mx.array) -> mx.array:
    """RHT(x): v = x * sigma (exact), v = H(v), y = v * s_d."""
    return hadamard(x32 * sigma) * numerics.scale(x32.shape[-1])


def rht_inverse(y32: mx.array, sigma: mx.array) -> mx.array:
    """RHT_inverse(y): v = Hᵀ(y), v = v * s_d, x = v * sigma (exact)."""
    return (hadamard(y32, transpose=True) * numerics.scale(y32.shape[-1])) * sigma
