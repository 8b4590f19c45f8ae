"""Randomized Hadamard transform and inverse (spec/rotation.md, 'Hadamard butterfly H' to 'RHT').

All transforms act on the last axis of a binary32 array; sign vectors broadcast over it.
"""
from __future__ import annotations

import numpy as np

import spec
from . import prng


def hadamard(v: np.ndarray) -> np.ndarray:
    """Unnormalized Walsh–Hadamard transform, Sylvester order, radix 2, ascending stages h = 1, 2, 4, ...

    At stage h the axis is viewed as blocks of 2h: the first half a, the second half b of each block
    become a + b and a − b (one binary32 add / subtract each), exactly the spec's loop.
    """
    v = np.asarray(v, dtype=np.float32)
    d = v.shape[-1]
    lead = v.shape[:-1]
    h = 1
    while h < d:
        blocks = v.reshape(lead + (d // (2 * h), 2, h))
        a = blocks[..., 0, :]
        b = blocks[..., 1, :]
        v = np.stack((a + b, a - b), axis=-2).reshape(lead + (d,))
        h *= 2
    return v


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
    """RHT_inverse(y): v = H(y); v = v × s_d; x = v ⊙ σ (exact)."""
    d = y.shape[-1]
    v = hadamard(np.asarray(y, dtype=np.float32))
    v = v * spec.scale(d)
    return v * sigma
