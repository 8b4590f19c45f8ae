"""`turboquant_rvq`: two-stage residual TurboQuant (spec/methods/turboquant_rvq.md)."""
from __future__ import annotations

import sys

import mlx.core as mx

from ... import spec
from . import codebooks, numerics, packing, prng, record, rotation, turboquant

NAME = "turboquant_rvq"
RULE = numerics.NORM_OVERFLOW     # the rule encode_tokens applies (kernels report it by this text)


def encode_tokens(x32: mx.array, p: spec.Params, dtype: mx.Dtype | None = None) -> dict[str, mx.array]:
    d = x32.shape[-1]
    n, _, u = turboquant.rotate_to_unit(x32, p)
    c1, b1 = codebooks.gaussian(p.bits, d)
    _, b2 = codebooks.residual(p.bits, p.bits2, d)
    i = codebooks.quantize(u, b1)
    e = u - codebooks.dequantize(i, c1)          # step 7: one subtract
    k = codebooks.quantize(e, b2)
    return {"codes1": packing.pack(i, p.bits), "codes2": packing.pack(k, p.bits2), "norm": n}


def decode_tokens(fields: dict[str, mx.array], p: spec.Params, d: int) -> mx.array:
    c1, _ = codebooks.gaussian(p.bits, d)
    c2, _ = codebooks.residual(p.bits, p.bits2, d)
    i = packing.unpack(fields["codes1"], p.bits, d)
    k = packing.unpack(fields["codes2"], p.bits2, d)
    # add, then multiply: two roundings
    y_hat = (codebooks.dequantize(i, c1) + codebooks.dequantize(k, c2)) * fields["norm"][..., None]
    return rotation.rht_inverse(y_hat, prng.head_signs(p, y_hat.shape[1], d))


def encode(x: mx.array, params: spec.Params, dtype=None) -> dict[str, mx.array]:
    return record.encode_with(sys.modules[__name__], x, params, dtype)


def decode(rec: dict[str, mx.array], params: spec.Params, dtype=None) -> mx.array:
    return record.decode_with(sys.modules[__name__], rec, params, dtype)
