"""`turboquant_prod`: MSE stage at b − 1 bits plus a 1-bit QJL sketch (spec/methods/turboquant_prod.md).

The QJL projection is the orthonormal RHT with τ (stream purpose 1), so it stays in the bit-exact tier.
"""
from __future__ import annotations

import numpy as np

from .. import spec
from . import codebooks, numerics, packing, record, rotation
from .prng import PURPOSE_QJL, PURPOSE_ROTATION
from .turboquant import prepare, rotate_to_unit


def encode(x, params: spec.Params, dtype: str) -> dict[str, np.ndarray]:
    p, xf, q = prepare(x, params, dtype)
    h, d = xf.shape[1], xf.shape[3]
    # 1–5. as turboquant.md (x, n, r, y, u).
    n, _r, _y, u, _sigma = rotate_to_unit(xf[:, :, :q], p)
    c, b = codebooks.gaussian(p.bits - 1, d)
    # 6. i_j = quantize(u_j; B_d) at b − 1 bits.
    i = codebooks.quantize(u, b)
    # 7. e_j = u_j − C_d[i_j].
    e = u - codebooks.dequantize(i, c)
    # 8. γ = sqrt(fold(e_j × e_j)).
    gamma = numerics.norm(e)
    # 9. w = RHT(e) with τ.
    tau = rotation.head_signs(p, h, d, PURPOSE_QJL)
    w = rotation.rht(e, tau)
    # 10. q_j = 1 if w_j < 0 (−0 and +0 give 0).
    qbits = (w < numerics.ZERO).astype(np.uint32)
    # 11. codes, qjl, norm, rnorm.
    return record.assemble(p, dtype, {"codes": packing.pack(i, p.bits - 1), "qjl": packing.pack(qbits, 1),
                                      "norm": n, "rnorm": gamma, "window": record.window_of(x, q)})


def decode(rec: dict, params: spec.Params, dtype: str) -> np.ndarray:
    p = params.resolved()
    _b, h, _q, _t, d = record.geometry(rec, p, dtype)
    p.check_head_dim(d)
    c, _bd = codebooks.gaussian(p.bits - 1, d)
    # 1. i = unpack(codes, b − 1); q = unpack(qjl, 1).
    i = packing.unpack(rec["codes"], p.bits - 1, d)
    qbits = packing.unpack(rec["qjl"], 1, d)
    # 2. s_j = −1 if q_j = 1 else +1.
    s = np.where(qbits == 1, np.float32(-1.0), np.float32(1.0)).astype(np.float32)
    # 3. t = RHT_inverse(s) with τ.
    tau = rotation.head_signs(p, h, d, PURPOSE_QJL)
    t = rotation.rht_inverse(s, tau)
    # 4. g = γ × A_d.
    g = rec["rnorm"] * spec.qjl_scale(d)
    # 5. ê_j = t_j × g.
    e_hat = t * g[..., None]
    # 6. û_j = C_d[i_j] + ê_j.
    u_hat = codebooks.dequantize(i, c) + e_hat
    # 7. ŷ_j = û_j × n.
    y_hat = u_hat * rec["norm"][..., None]
    # 8. x̂ = RHT_inverse(ŷ) with σ.
    sigma = rotation.head_signs(p, h, d, PURPOSE_ROTATION)
    return record.with_window(rotation.rht_inverse(y_hat, sigma), rec, dtype)
