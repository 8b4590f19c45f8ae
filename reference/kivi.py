"""`kivi`: asymmetric group quantization, stored packed (spec/methods/kivi.md).

Keys (role "k") are grouped per channel over G consecutive tokens; values (role "v") per token over G
consecutive channels. Codes are always per token, packed along the channel axis.
"""
from __future__ import annotations

import numpy as np

from .. import spec
from . import numerics, packing, record
from .turboquant import prepare


def _grouped(v: np.ndarray, p: spec.Params) -> np.ndarray:
    """View (B, H, Q, d) so that axis −2 runs over one group's G elements."""
    bsz, h, q, d = v.shape
    g = p.group_size
    if p.role == "k":
        return v.reshape(bsz, h, q // g, g, d)            # groups: (B, H, Q/G, ·, d)
    return v.reshape(bsz, h, q, d // g, g).swapaxes(-1, -2)  # groups: (B, H, Q, ·, d/G)


def _ungrouped(v: np.ndarray, p: spec.Params, shape) -> np.ndarray:
    if p.role == "k":
        return v.reshape(shape)
    return v.swapaxes(-1, -2).reshape(shape)


def encode(x, params: spec.Params, dtype: str) -> dict[str, np.ndarray]:
    p, xf, q = prepare(x, params, dtype)
    levels = np.float32((1 << p.bits) - 1)  # L = 2^b − 1
    v = _grouped(xf[:, :, :q], p)
    # 1. m = min(v) + 0.0; M = max(v) + 0.0 (turns −0 into +0).
    m = v.min(axis=-2) + numerics.ZERO
    big = v.max(axis=-2) + numerics.ZERO
    # 2. s = (M − m) ÷ L (a binary32 range can overflow to +Inf; step 3 rejects it).
    with np.errstate(over="ignore"):
        s = (big - m) / levels
    # 3. s16, z16 by RNE; a non-finite one is rejected.
    s16 = numerics.to_float16(s)
    z16 = numerics.to_float16(m)
    if not (np.isfinite(s16).all() and np.isfinite(z16).all()):
        raise ValueError("x: a kivi group's float16 scale or zero is not finite (values beyond float16 range)")
    # 4. S, Z: exact upcasts.
    big_s = s16.astype(np.float32)[..., None, :]
    big_z = z16.astype(np.float32)[..., None, :]
    # 5a. y = (v − Z) ÷ S where S ≠ 0 (S = 0 gives c = 0).
    nz = big_s != numerics.ZERO
    y = np.divide(v - big_z, big_s, out=np.zeros(v.shape, np.float32), where=nz)
    # 5b. clamp to [0, L] before rounding and before the integer cast.
    y = np.minimum(np.maximum(y, numerics.ZERO), levels)
    # 5c. c = rint(y) (ties to even), then the exact integer cast.
    c = numerics.rint(y).astype(np.uint32)
    codes = _ungrouped(c, p, xf[:, :, :q].shape)
    # 6. store packed codes, s16, z16.
    return record.assemble(p, dtype, {"codes": packing.pack(codes, p.bits), "scale": s16, "zero": z16,
                                      "window": record.window_of(x, q)})


def decode(rec: dict, params: spec.Params, dtype: str) -> np.ndarray:
    p = params.resolved()
    bsz, h, q, _t, d = record.geometry(rec, p, dtype)
    p.check_head_dim(d)
    c = packing.unpack(rec["codes"], p.bits, d).astype(np.float32)
    cg = _grouped(c, p)
    big_s = rec["scale"].astype(np.float32)[..., None, :]
    big_z = rec["zero"].astype(np.float32)[..., None, :]
    # x̂ = c × S + Z: a binary32 multiply, then a binary32 add (never fused).
    x_hat = cg * big_s + big_z
    return record.with_window(_ungrouped(x_hat, p, (bsz, h, q, d)), rec, dtype)
