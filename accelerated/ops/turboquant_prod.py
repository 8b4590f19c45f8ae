"""`turboquant_prod`: MSE stage at b-1 bits plus a 1-bit QJL sketch of the residual
(spec/methods/turboquant_prod.md). The projection is the RHT with the purpose-1 stream tau."""
from __future__ import annotations

import sys

import mlx.core as mx

from ... import spec
from . import codebooks, numerics, packing, prng, record, rotation, turboquant

NAME = "turboquant_prod"
RULE = numerics.NORM_OVERFLOW     # the rule encode_tokens applies (kernels report it by this text)


def encode_tokens(x32: mx.array, p: spec.Params, dtype: mx.Dtype | None = None) -> dict[str, mx.array]:
    d, heads = x32.shape[-1], x32.shape[1]
    n, _, u = turboquant.rotate_to_unit(x32, p)
    cd, bd = codebooks.gaussian(p.bits - 1, d)
    i = codebooks.quantize(u, bd)
    e = u - codebooks.dequantize(i, cd)
    gamma = numerics.norm(e)
    w = rotation.rht(e, prng.head_signs(p, heads, d, prng.PURPOSE_QJL))
    q = (w < numerics.f32(0.0)).astype(mx.uint32)   # -0 is not < 0: gives 0
    return {"codes": packing.pack(i, p.bits - 1), "qjl": packing.pack(q, 1), "norm": n, "rnorm": gamma}


def decode_tokens(fields: dict[str, mx.array], p: spec.Params, d: int) -> mx.array:
    heads = fields["norm"].shape[1]
    cd, _ = codebooks.gaussian(p.bits - 1, d)
    i = packing.unpack(fields["codes"], p.bits - 1, d)
    q = packing.unpack(fields["qjl"], 1, d)
    s = mx.where(q == 1, numerics.f32(-1.0), numerics.f32(1.0))
    t = rotation.rht_inverse(s, prng.head_signs(p, heads, d, prng.PURPOSE_QJL))
    g = fields["rnorm"] * numerics.qjl_scale(d)
    e_hat = t * g[..., None]
    u_hat = codebooks.dequantize(i, cd) + e_hat
    y_hat = u_hat * fields["norm"][..., None]
    return rotation.rht_inverse(y_hat, prng.head_signs(p, heads, d))


def encode(x: mx.array, params: spec.Params, dtype=None) -> dict[str, mx.array]:
    return record.encode_with(sys.modules[__name__], x, params, dtype)


def decode(rec: dict[str, mx.array], params: spec.Params, dtype=None) -> mx.array:
    return record.decode_with(sys.modules[__name__], rec, params, dtype)
