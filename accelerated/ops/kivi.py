"""`kivi`: asymmetric min/max group quantization, float16 scale and zero (spec/methods/kivi.md).

Keys (role k) group G consecutive tokens of one channel; values (role v) group G consecutive channels of
one token. Codes are always per token, packed along channels. No rotation, no randomness.
"""
from __future__ import annotations

import sys

import mlx.core as mx

from ... import spec
from . import numerics, packing, record

NAME = "kivi"
RULE = "x: kivi float16 scale or zero overflows (not finite)"   # the rule encode_tokens applies



def _groups(x32: mx.array, p: spec.Params) -> mx.array:
    """View with the group members on axis -2 (k: (B,H,Q/G,G,d)) or -1 (v: (B,H,Q,d/G,G))."""
    b, h, q, d = x32.shape
    g = p.group_size
    if p.role == "k":
        return x32.reshape(b, h, q // g, g, d)
    return x32.reshape(b, h, q, d // g, g)


def encode_tokens(x32: mx.array, p: spec.Params, dtype: mx.Dtype | None = None) -> dict[str, mx.array]:
    b, h, q, d = x32.shape
    if q % p.group_size:
        raise ValueError(f"x: kivi encodes whole groups; {q} tokens is not a multiple of {p.group_size}")
    axis = -2 if p.role == "k" else -1
    v = _groups(x32, p)
    zero = numerics.f32(0.0)
    m = mx.min(v, axis=axis, keepdims=True) + zero       # min/max are exact; + 0.0 turns -0 into +0
    big = mx.max(v, axis=axis, keepdims=True) + zero
    levels = numerics.f32(float((1 << p.bits) - 1))
    s16 = ((big - m) / levels).astype(mx.float16)       # RNE to float16
    z16 = m.astype(mx.float16)
    if s16.size:
        numerics.fault_nonfinite(s16, RULE)
        numerics.fault_nonfinite(z16, RULE)
    s32 = s16.astype(mx.float32)
    z32 = z16.astype(mx.float32)
    nz = s32 != zero
    y = (v - z32) / mx.where(nz, s32, numerics.f32(1.0))  # S = 0 groups divide by 1, then code 0
    y = mx.minimum(mx.maximum(y, zero), levels)          # clamp before rounding and the cast
    c = mx.where(nz, numerics.rint(y), zero).astype(mx.uint32)
    c = c.reshape(b, h, q, d)
    return {"codes": packing.pack(c, p.bits), "scale": s16.squeeze(axis), "zero": z16.squeeze(axis)}


def decode_tokens(fields: dict[str, mx.array], p: spec.Params, d: int) -> mx.array:
    codes = fields["codes"]
    b, h, q, _ = codes.shape
    c = packing.unpack(codes, p.bits, d).astype(mx.float32)
    s = fields["scale"].astype(mx.float32)
    z = fields["zero"].astype(mx.float32)
    axis = -2 if p.role == "k" else -1
    s, z = mx.expand_dims(s, axis), mx.expand_dims(z, axis)
    x_hat = _groups(c, p) * s + z      # multiply, then add: two ops, never fused (no mx.compile)
    return x_hat.reshape(b, h, q, d)


def encode(x: mx.array, params: spec.Params, dtype=None) -> dict[str, mx.array]:
    return record.encode_with(sys.modules[__name__], x, params, dtype)


def decode(rec: dict[str, mx.array], params: spec.Params, dtype=None) -> mx.array:
    return record.decode_with(sys.modules[__name__], rec, params, dtype)
