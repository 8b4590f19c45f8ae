"""SplitMix64, stream keys and sign vectors (spec/rotation.md, sections 'SplitMix64' to 'Sign vector').

Integer arithmetic uses Python ints masked to 64 bits (unsigned, modulo 2^64); only the handful of words
per stream is drawn here, so clarity wins over vectorization.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import spec

MASK = (1 << 64) - 1
_P = spec.formats()["prng"]
GAMMA = int(_P["gamma"], 16)
MUL1 = int(_P["mix_mul1"], 16)
MUL2 = int(_P["mix_mul2"], 16)
PURPOSE_ROTATION = int(_P["purpose_rotation"])
PURPOSE_QJL = int(_P["purpose_qjl"])


def mix64(z: int) -> int:
    z &= MASK
    z = ((z ^ (z >> 30)) * MUL1) & MASK
    z = ((z ^ (z >> 27)) * MUL2) & MASK
    return z ^ (z >> 31)


def next_word(state: int) -> tuple[int, int]:
    """One SplitMix64 step: (new_state, word)."""
    state = (state + GAMMA) & MASK
    return state, mix64(state)


def words(state: int, count: int) -> list[int]:
    out = []
    for _ in range(count):
        state, w = next_word(state)
        out.append(w)
    return out


def stream_key(seed: int, layer: int, head: int, role_id: int, purpose: int) -> int:
    """Initial SplitMix64 state of stream (seed, layer, global head, role, purpose)."""
    k = mix64(seed)
    k = mix64(k ^ layer)
    k = mix64(k ^ head)
    k = mix64(k ^ (2 * role_id + purpose))
    return k


@functools.lru_cache(maxsize=4096)
def sign_vector(seed: int, layer: int, head: int, role_id: int, purpose: int, d: int) -> np.ndarray:
    """σ ∈ {+1, −1}^d as binary32: bit j = bit (j mod 64) of word j div 64; a set bit means −1."""
    w = np.array(words(stream_key(seed, layer, head, role_id, purpose), -(-d // 64)), dtype=np.uint64)
    j = np.arange(d)
    bit = (w[j // 64] >> (j % 64).astype(np.uint64)) & np.uint64(1)
    sigma = np.where(bit == 1, np.float32(-1.0), np.float32(1.0)).astype(np.float32)
    sigma.setflags(write=False)
    return sigma
