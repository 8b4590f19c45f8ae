"""`mlx_affine`: MLX's affine `mx.quantize` format as its CPU backend computes it
(spec/methods/mlx_affine.md). Per token, groups of G consecutive channels; scales and biases stored in
the input dtype T."""
from __future__ import annotations

import sys

import mlx.core as mx

from ... import spec
from . import numerics, packing, record

NAME = "mlx_affine"
RULE = "x: mlx_affine group range (max - min) overflows binary32"   # the rule encode_tokens applies
EPS = float.fromhex("0x1.ad7f2ap-24")  # binary32(1e-7), spec/methods/mlx_affine.md



def encode_tokens(x32: mx.array, p: spec.Params, dtype: mx.Dtype | None = None) -> dict[str, mx.array]:
    if dtype is None:
        raise ValueError("dtype: mlx_affine stores scales in the input dtype; it must be given")
    b, h, q, d = x32.shape
    g = p.group_size
    w = x32.reshape(b, h, q, d // g, g)
    levels = numerics.f32(float((1 << p.bits) - 1))
    zero = numerics.f32(0.0)
    m = mx.min(w, axis=-1, keepdims=True)
    big = mx.max(w, axis=-1, keepdims=True)
    span = big - m
    if span.size:   # MLX would store scale Inf and decode NaN
        numerics.fault_nonfinite(span, RULE)
    flip = mx.abs(m) > mx.abs(big)
    s = mx.maximum(span / levels, numerics.f32(EPS))
    s = mx.where(flip, s, -s)
    edge = mx.where(flip, m, big)
    q0 = numerics.rint_any(edge / s)
    nz = q0 != zero
    s = mx.where(nz, edge / mx.where(nz, q0, numerics.f32(1.0)), s)
    beta = mx.where(nz, edge, zero)
    c = mx.minimum(mx.maximum((w - beta) / s, zero), levels)  # clamp, then round (same as MLX's order)
    c = numerics.rint(c).astype(mx.uint32).reshape(b, h, q, d)
    return {"codes": packing.pack(c, p.bits), "scales": s.squeeze(-1).astype(dtype),
            "biases": beta.squeeze(-1).astype(dtype)}


def decode_tokens(fields: dict[str, mx.array], p: spec.Params, d: int) -> mx.array:
    codes = fields["codes"]
    b, h, q, _ = codes.shape
    dt = fields["scales"].dtype
    g = d // p.group_size
    s = numerics.upcast(fields["scales"])[..., None]
    bias = numerics.upcast(fields["biases"])[..., None]
    c = packing.unpack(codes, p.bits, d).reshape(b, h, q, g, p.group_size)
    if _per_group_table(p, dt):
        # the same T(T(c * S) + Bi) for each of the 2^bits levels of a group, then one gather per code: fewer
        # of the float16 / bfloat16 casts that dominate on MLX's CPU backend (2048 x 8 rows, float16: 25.7
        # -> 12.4 ms on the 2-core CI CPU; float32 scales need no cast and stay elementwise)
        lv = mx.arange(1 << p.bits, dtype=mx.float32)
        tab = numerics.upcast((numerics.upcast((lv * s).astype(dt)) + bias).astype(dt))   # (b, h, q, g, 2^bits)
        return mx.take_along_axis(tab, c, axis=-1).reshape(b, h, q, d)
    prod = numerics.upcast((c.astype(mx.float32) * s).astype(dt))        # T(c * S)
    v = numerics.upcast((prod + bias).astype(dt))                         # T(p + Bi)
    return v.reshape(b, h, q, d)


def _per_group_table(p: spec.Params, dt) -> bool:
    """Whether decode_tokens looks the values up from a per-group table: on the CPU, for float16 / bfloat16
    scales, where a group has more channels than levels (both ways give the same bits)."""
    return (dt in (mx.float16, mx.bfloat16) and (1 << p.bits) < p.group_size
            and mx.default_device() == mx.cpu)


def encode(x: mx.array, params: spec.Params, dtype=None) -> dict[str, mx.array]:
    return record.encode_with(sys.modules[__name__], x, params, dtype)


def decode(rec: dict[str, mx.array], params: spec.Params, dtype=None) -> mx.array:
    return record.decode_with(sys.modules[__name__], rec, params, dtype)
