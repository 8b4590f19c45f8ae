"""`turboquant`: MSE TurboQuant, norm kept apart (spec/methods/turboquant.md).

Also home of the shared front end `rotate_to_unit` (steps 1-5: norm, reciprocal, RHT, unit vector) that turboquant_rvq,
turboquant_prod and rabitq reuse.
"""
from __future__ import annotations

import sys

import mlx.core as mx

from ... import spec
from . import codebooks, numerics, packing, prng, record, rotation

NAME = "turboquant"
RULE = numerics.NORM_OVERFLOW     # the rule encode_tokens applies (kernels report it by this text)



def rotate_to_unit(x32: mx.array, p: spec.Params) -> tuple[mx.array, mx.array, mx.array]:
    """Steps 1-5: n = norm (rejects +Inf: x), r = 1/n or 0, y = RHT(x) with sigma, u = y * r.
    Returns (n, y, u). Only encoded tokens come here, so only they are checked (streaming.md)."""
    n = numerics.norm(x32)
    numerics.check_norm_finite(n)
    r = numerics.reciprocal_or_zero(n)
    sigma = prng.head_signs(p, x32.shape[1], x32.shape[-1])
    y = rotation.rht(x32, sigma)
    return n, y, y * r[..., None]


def encode_tokens(x32: mx.array, p: spec.Params, dtype: mx.Dtype | None = None) -> dict[str, mx.array]:
    n, _, u = rotate_to_unit(x32, p)
    _, bd = codebooks.gaussian(p.bits, x32.shape[-1])
    return {"codes": packing.pack(codebooks.quantize(u, bd), p.bits), "norm": n}


def decode_tokens(fields: dict[str, mx.array], p: spec.Params, d: int) -> mx.array:
    cd, _ = codebooks.gaussian(p.bits, d)
    i = packing.unpack(fields["codes"], p.bits, d)
    y_hat = codebooks.dequantize(i, cd) * fields["norm"][..., None]
    sigma = prng.head_signs(p, y_hat.shape[1], d)
    return rotation.rht_inverse(y_hat, sigma)


def encode(x: mx.array, params: spec.Params, dtype=None) -> dict[str, mx.array]:
    return record.encode_with(sys.modules[__name__], x, params, dtype)


def decode(rec: dict[str, mx.array], params: spec.Params, dtype=None) -> mx.array:
    return record.decode_with(sys.modules[__name__], rec, params, dtype)
