"""`turboquant_rvq`: two-stage residual TurboQuant (spec/methods/turboquant_rvq.md)."""
from __future__ import annotations

import numpy as np

from .. import spec
from . import codebooks, packing, record, rotation
from .prng import PURPOSE_ROTATION
from .turboquant import prepare, rotate_to_unit


def encode(x, params: spec.Params, dtype: str) -> dict[str, np.ndarray]:
    p, xf, q = prepare(x, params, dtype)
    d = xf.shape[3]
    # 1–5. as turboquant.md (x, n, r, y, u).
    n, _r, _y, u, _sigma = rotate_to_unit(xf[:, :, :q], p)
    c1, b1 = codebooks.gaussian(p.bits, d)
    _c2, b2 = codebooks.residual(p.bits, p.bits2, d)
    # 6. i_j = quantize(u_j; B1_d).
    i = codebooks.quantize(u, b1)
    # 7. e_j = u_j − C1_d[i_j].
    e = u - codebooks.dequantize(i, c1)
    # 8. k_j = quantize(e_j; B2_d).
    k = codebooks.quantize(e, b2)
    # 9. codes1 = pack(i, b); codes2 = pack(k, b2); norm = n.
    return record.assemble(p, dtype, {"codes1": packing.pack(i, p.bits), "codes2": packing.pack(k, p.bits2),
                                      "norm": n, "window": record.window_of(x, q)})


def decode(rec: dict, params: spec.Params, dtype: str) -> np.ndarray:
    p = params.resolved()
    _b, h, _q, _t, d = record.geometry(rec, p, dtype)
    p.check_head_dim(d)
    c1, _b1 = codebooks.gaussian(p.bits, d)
    c2, _b2 = codebooks.residual(p.bits, p.bits2, d)
    # 1. i = unpack(codes1, b); k = unpack(codes2, b2).
    i = packing.unpack(rec["codes1"], p.bits, d)
    k = packing.unpack(rec["codes2"], p.bits2, d)
    # 2. ŷ_j = (C1_d[i_j] + C2_d[k_j]) × n: add, then multiply (two roundings).
    y_hat = (codebooks.dequantize(i, c1) + codebooks.dequantize(k, c2)) * rec["norm"][..., None]
    # 3. x̂ = RHT_inverse(ŷ) with σ.
    sigma = rotation.head_signs(p, h, d, PURPOSE_ROTATION)
    return record.with_window(rotation.rht_inverse(y_hat, sigma), rec, dtype)
