"""`rabitq`: 1-bit sign codes with the correction factor ip = <x_bar, u> (spec/methods/rabitq.md)."""
from __future__ import annotations

import sys

import mlx.core as mx

from ... import spec
from . import numerics, packing, prng, record, rotation, turboquant

NAME = "rabitq"
RULE = numerics.NORM_OVERFLOW     # the rule encode_tokens applies (kernels report it by this text)


def encode_tokens(x32: mx.array, p: spec.Params, dtype: mx.Dtype | None = None) -> dict[str, mx.array]:
    d = x32.shape[-1]
    n, y, _ = turboquant.rotate_to_unit(x32, p)
    r = numerics.reciprocal_or_zero(n)           # same r as step 3 (recomputed: cheap, exact)
    a = numerics.fold(mx.abs(y))
    ip = (a * numerics.scale(d)) * r             # two multiplies
    q = (y < numerics.f32(0.0)).astype(mx.uint32)
    return {"codes": packing.pack(q, 1), "norm": n, "ip": ip}


def decode_tokens(fields: dict[str, mx.array], p: spec.Params, d: int) -> mx.array:
    q = packing.unpack(fields["codes"], 1, d)
    ip = fields["ip"]
    pos = ip > numerics.f32(0.0)
    g = mx.where(pos, (fields["norm"] * numerics.scale(d)) / mx.where(pos, ip, numerics.f32(1.0)),
                 numerics.f32(0.0))[..., None]
    y_hat = mx.where(q == 1, -g, g)              # exact sign flip
    return rotation.rht_inverse(y_hat, prng.head_signs(p, y_hat.shape[1], d))


def encode(x: mx.array, params: spec.Params, dtype=None) -> dict[str, mx.array]:
    return record.encode_with(sys.modules[__name__], x, params, dtype)


def decode(rec: dict[str, mx.array], params: spec.Params, dtype=None) -> mx.array:
    return record.decode_with(sys.modules[__name__], rec, params, dtype)
