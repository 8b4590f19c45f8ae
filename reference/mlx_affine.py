"""`mlx_affine`: MLX's `mx.quantize(..., mode="affine")` format as MLX 0.32.4's CPU backend computes it
(spec/methods/mlx_affine.md). Groups are G consecutive channels of one token; no rotation."""
from __future__ import annotations

import numpy as np

from .. import spec
from . import numerics, packing, record
from .turboquant import prepare

EPS = spec.hexf32("0x1.ad7f2ap-24")  # binary32(1e-7)


def _groups(v: np.ndarray, g: int) -> np.ndarray:
    """(B, H, Q, d) -> (B, H, Q, d/G, G)."""
    return v.reshape(v.shape[:-1] + (v.shape[-1] // g, g))


def encode(x, params: spec.Params, dtype: str) -> dict[str, np.ndarray]:
    p, xf, q = prepare(x, params, dtype)  # also checks G <= d
    levels = np.float32((1 << p.bits) - 1)  # N = 2^b − 1
    w = _groups(xf[:, :, :q], p.group_size)
    # 1. m = min(w); M = max(w) (exact).
    m = w.min(axis=-1)
    big = w.max(axis=-1)
    # 2. flip = |m| > |M|.
    flip = np.abs(m) > np.abs(big)
    # 3. s = max((M − m) ÷ N, EPS).
    #    A range M − m that overflows to +Inf is rejected (MLX would store an infinite scale).
    with np.errstate(over="ignore"):
        span = big - m
    if np.isinf(span).any():
        raise ValueError("x: a group's range max − min overflows binary32 (mlx_affine)")
    s = np.maximum(span / levels, EPS)
    # 4. s = −s unless flip; edge = m if flip else M.
    s = np.where(flip, s, -s)
    edge = np.where(flip, m, big)
    # 5. q0 = rint(edge ÷ s), ties to even (np.rint is exact RNE at any magnitude; |edge/s| may be large).
    q0 = np.rint(edge / s)
    # 6. q0 ≠ 0: s = edge ÷ q0, β = edge; else β = 0.
    nz = q0 != numerics.ZERO
    s = np.where(nz, np.divide(edge, q0, out=np.ones_like(edge), where=nz), s)
    beta = np.where(nz, edge, numerics.ZERO)
    # 7. c = rint((w − β) ÷ s) clamped to [0, N]; clamping first (our rule) gives the same integer since
    #    the bounds are integers, and keeps the magic-number rint in its exact range.
    y = (w - beta[..., None]) / s[..., None]
    y = np.minimum(np.maximum(y, numerics.ZERO), levels)
    c = numerics.rint(y).astype(np.uint32).reshape(xf[:, :, :q].shape)
    # 8. codes packed; scales, biases rounded (RNE) to the input dtype.
    return record.assemble(p, dtype, {"codes": packing.pack(c, p.bits),
                                      "scales": numerics.downcast(s, dtype),
                                      "biases": numerics.downcast(beta, dtype),
                                      "window": record.window_of(x, q)})


def decode(rec: dict, params: spec.Params, dtype: str) -> np.ndarray:
    p = params.resolved()
    _b, _h, _q, _t, d = record.geometry(rec, p, dtype)
    p.check_head_dim(d)
    c = _groups(packing.unpack(rec["codes"], p.bits, d).astype(np.float32), p.group_size)
    big_s = numerics.upcast(rec["scales"], dtype)[..., None]
    bias = numerics.upcast(rec["biases"], dtype)[..., None]
    # 1. p = T(c × S): binary32 product, rounded to the input dtype T.
    prod = numerics.upcast(numerics.downcast(c * big_s, dtype), dtype)
    # 2. v = T(p + Bi): binary32 sum, rounded to T.   3. output binary32(v).
    v = numerics.upcast(numerics.downcast(prod + bias, dtype), dtype)
    return record.with_window(v.reshape(v.shape[:-2] + (d,)), rec, dtype)
