"""`turboquant`: MSE TurboQuant with the norm kept apart (spec/methods/turboquant.md).

`rotate_to_unit` is turboquant.md encode steps 1–5, shared by turboquant_rvq, turboquant_prod and
rabitq, whose chapters say "as turboquant.md steps 1–5".
"""
from __future__ import annotations

import numpy as np

from .. import spec
from . import codebooks, numerics, packing, record, rotation
from .prng import PURPOSE_ROTATION


def prepare(x, params: spec.Params, dtype: str):
    """Validate; return (resolved params, binary32 upcast of x, Q)."""
    p = params.resolved()
    xf = numerics.check_x(x, dtype, p)   # group size against d before x's values
    return p, xf, p.encoded_tokens(xf.shape[2])


def rotate_to_unit(xf: np.ndarray, p: spec.Params):
    """Steps 1–5 on binary32 tokens (B, H, Q, d): returns (n, r, y, u, σ)."""
    d = xf.shape[3]
    # 2. n = sqrt(fold(x_j * x_j)); a +Inf norm is rejected.
    n = numerics.norm(xf)
    numerics.check_norm_finite(n)
    # 3. r = 1 / n if n > 0 else 0 (the zero vector keeps u = ±0).
    r = numerics.reciprocal_or_zero(n)
    # 4. y = RHT(x) with σ of (seed, layer, head_offset + h, role, purpose 0).
    sigma = rotation.head_signs(p, xf.shape[1], d, PURPOSE_ROTATION)
    y = rotation.rht(xf, sigma)
    # 5. u_j = y_j * r.
    u = y * r[..., None]
    return n, r, y, u, sigma


def encode(x, params: spec.Params, dtype: str) -> dict[str, np.ndarray]:
    p, xf, q = prepare(x, params, dtype)
    d = xf.shape[3]
    # 1. exact upcast (done in prepare); only tokens 0..Q−1 are encoded, the rest is the window.
    n, _r, _y, u, _sigma = rotate_to_unit(xf[:, :, :q], p)
    _c, b = codebooks.gaussian(p.bits, d)
    # 6. i_j = quantize(u_j; B_d).
    i = codebooks.quantize(u, b)
    # 7. codes = pack(i, b); norm = n.
    return record.assemble(p, dtype, {"codes": packing.pack(i, p.bits), "norm": n,
                                      "window": record.window_of(x, q)})


def decode(rec: dict, params: spec.Params, dtype: str) -> np.ndarray:
    p = params.resolved()
    bsz, h, q, _t, d = record.geometry(rec, p, dtype)
    p.check_head_dim(d)
    c, _b = codebooks.gaussian(p.bits, d)
    # 1. i = unpack(codes, b).
    i = packing.unpack(rec["codes"], p.bits, d)
    # 2. ŷ_j = C_d[i_j] * n.
    y_hat = codebooks.dequantize(i, c) * rec["norm"][..., None]
    # 3. x̂ = RHT_inverse(ŷ) with σ.
    sigma = rotation.head_signs(p, h, d, PURPOSE_ROTATION)
    return record.with_window(rotation.rht_inverse(y_hat, sigma), rec, dtype)
