"""Randomized Hadamard transform and its inverse (spec/rotation.md).

H is the unnormalized Walsh-Hadamard butterfly with ascending stages; the scale s_d is a separate
multiply after all stages. `mx.hadamard_transform(v, scale=1.0)` is used only on devices where it was
verified bitwise equal to the explicit butterfly (tests/test_accelerated_ops.py checks it on CPU for
every head dim); elsewhere the explicit butterfly below runs.
"""
from __future__ import annotations

import os

import mlx.core as mx

from accelerated.ops import numerics

# Device types on which mx.hadamard_transform(scale=1.0) equals `butterfly` bit for bit (verified).
BUILTIN_VERIFIED = {mx.DeviceType.cpu}
# VELOXQUANT_EXPLICIT_HADAMARD=1 forces the explicit butterfly everywhere (testing, unverified devices).
_FORCE_EXPLICIT = os.environ.get("VELOXQUANT_EXPLICIT_HADAMARD", "") not in ("", "0")


def butterfly(v: mx.array) -> mx.array:
    """Explicit H over the last axis: stage h pairs v[i] and v[i+h] in blocks of 2h (a+b, a-b)."""
    d = v.shape[-1]
    lead = v.shape[:-1]
    h = 1
    while h < d:
        w = v.reshape(*lead, d // (2 * h), 2, h)
        a = w[..., 0, :]
        b = w[..., 1, :]
        v = mx.stack([a + b, a - b], axis=-2).reshape(*lead, d)
        h *= 2
    return v


def hadamard(v: mx.array) -> mx.array:
    """H(v) over the last axis, float32."""
    if v.size == 0:  # mx.hadamard_transform rejects empty arrays (e.g. T <= window: nothing encoded)
        return v
    if not _FORCE_EXPLICIT and mx.default_device().type in BUILTIN_VERIFIED:
        return mx.hadamard_transform(v, scale=1.0)
    return butterfly(v)


def rht(x32: mx.array, sigma: mx.array) -> mx.array:
    """RHT(x): v = x * sigma (exact), v = H(v), y = v * s_d."""
    return hadamard(x32 * sigma) * numerics.scale(x32.shape[-1])


def rht_inverse(y32: mx.array, sigma: mx.array) -> mx.array:
    """RHT_inverse(y): v = H(y), v = v * s_d, x = v * sigma (exact)."""
    return (hadamard(y32) * numerics.scale(y32.shape[-1])) * sigma
