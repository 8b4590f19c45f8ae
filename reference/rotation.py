"""Randomized Hadamard transform and inverse (spec/rotation.md, 'Hadamard transform H' to 'RHT').

All transforms act on the last axis of a binary32 array; sign vectors broadcast over it.
"""
from __future__ import annotations

import numpy as np

from .. import spec
from . import prng


def butterfly(v: np.ndarray) -> np.ndarray:
    """Stage A: unnormalized Walsh–Hadamard transform of each block of n = 2^k contiguous values of the
    last axis (n given by the axis' last-but-one split, see `hadamard`), Sylvester order, radix 2,
    ascending stages h = 1, 2, 4, ...

    At stage h each block is viewed as groups of 2h: the first half a, the second half b of each group
    become a + b and a − b (one binary32 add / subtract each), exactly the spec's loop.
    """
    v = np.asarray(v, dtype=np.float32)
    n = v.shape[-1]
    lead = v.shape[:-1]
    h = 1
    while h < n:
        groups = v.reshape(lead + (n // (2 * h), 2, h))
        a = groups[..., 0, :]
        b = groups[..., 1, :]
        v = np.stack((a + b, a - b), axis=-2).reshape(lead + (n,))
        h *= 2
    return v


def hadamard(v: np.ndarray, transpose: bool = False) -> np.ndarray:
    """H(v) (or Hᵀ(v)) over the last axis, d = m · n (rotation.md):
    A. the butterfly on each of the m blocks v[k n .. k n + n − 1];
    B. for m > 1, at each position i of a block, with w_k = v[k n + i]:
       out[j n + i] = ((+0 ± w_0) ± w_1) ± … ± w_{m−1}, the sign of w_k being H_m[j][k] (Hᵀ: H_m[k][j]),
       one binary32 add or subtract per term, left to right from +0.
    For m = 1 (powers of two) only stage A runs: the v1.0 transform; H is symmetric then, and for m = 12.
    """
    v = np.asarray(v, dtype=np.float32)
    d = v.shape[-1]
    lead = v.shape[:-1]
    m, n = spec.split_head_dim(d)
    w = butterfly(v.reshape(lead + (m, n)))                  # stage A, block by block
    if m == 1:
        return w.reshape(lead + (d,))
    hm = spec.hadamard_matrix(m)
    if transpose:
        hm = hm.T
    acc = np.zeros(lead + (m, n), dtype=np.float32)        # stage B: out_j starts at +0 for every j
    for k in range(m):
        term = w[..., k:k + 1, :]                           # w_k, broadcast over the m outputs j
        plus = (hm[:, k] > 0)[:, None]                      # sign of w_k in output j
        acc = np.where(plus, acc + term, acc - term)
    return acc.reshape(lead + (d,))


def head_signs(params: spec.Params, n_heads: int, d: int, purpose: int) -> np.ndarray:
    """σ of every local head h as an (1, H, 1, d) array, from the global head index head_offset + h."""
    p = params
    rows = [prng.sign_vector(p.seed, p.layer, p.head_offset + h, p.role_id, purpose, d) for h in range(n_heads)]
    return np.stack(rows).reshape(1, n_heads, 1, d)


def rht(x: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """RHT(x): v = x ⊙ σ (exact); v = H(v); y = v × s_d (one multiply after all stages)."""
    d = x.shape[-1]
    v = np.asarray(x, dtype=np.float32) * sigma
    v = hadamard(v)
    return v * spec.scale(d)


def rht_inverse(y: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """RHT_inverse(y): v = Hᵀ(y); v = v × s_d; x = v ⊙ σ (exact)."""
    d = y.shape[-1]
    v = hadamard(np.asarray(y, dtype=np.float32), transpose=True)
    v = v * spec.scale(d)
    return v * sigma
