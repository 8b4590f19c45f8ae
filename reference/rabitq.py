"""`rabitq`: 1-bit sign codes with the correction factor ip = ⟨x̄, u⟩ (spec/methods/rabitq.md)."""
from __future__ import annotations

import numpy as np

from .. import spec
from . import numerics, packing, record, rotation
from .prng import PURPOSE_ROTATION
from .turboquant import prepare, rotate_to_unit


def encode(x, params: spec.Params, dtype: str) -> dict[str, np.ndarray]:
    p, xf, q = prepare(x, params, dtype)
    d = xf.shape[3]
    # 1–4. as turboquant.md (x, n, r, y).
    n, r, y, _u, _sigma = rotate_to_unit(xf[:, :, :q], p)
    # 5. a = fold(|y_j|).
    a = numerics.fold(np.abs(y))
    # 6. ip = (a × s_d) × r (r = 0 for the zero vector gives ip = 0).
    ip = (a * spec.scale(d)) * r
    # 7. q_j = 1 if y_j < 0.
    qbits = (y < numerics.ZERO).astype(np.uint32)
    # 8. codes = pack(q, 1); norm = n; ip.
    return record.assemble(p, dtype, {"codes": packing.pack(qbits, 1), "norm": n, "ip": ip,
                                      "window": record.window_of(x, q)})


def decode(rec: dict, params: spec.Params, dtype: str) -> np.ndarray:
    p = params.resolved()
    _b, h, _q, _t, d = record.geometry(rec, p, dtype)
    p.check_head_dim(d)
    # 1. q = unpack(codes, 1).
    qbits = packing.unpack(rec["codes"], 1, d)
    # 2. g = (n × s_d) ÷ ip if ip > 0 else 0.
    ip = rec["ip"]
    ns = rec["norm"] * spec.scale(d)
    g = np.divide(ns, ip, out=np.zeros_like(ns), where=ip > numerics.ZERO)
    # 3. ŷ_j = −g if q_j = 1 else g (exact sign flip).
    g = g[..., None]
    y_hat = np.where(qbits == 1, -g, g).astype(np.float32)
    # 4. x̂ = RHT_inverse(ŷ) with σ.
    sigma = rotation.head_signs(p, h, d, PURPOSE_ROTATION)
    return record.with_window(rotation.rht_inverse(y_hat, sigma), rec, dtype)
