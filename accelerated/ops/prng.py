"""SplitMix64, stream keys and sign vectors (spec/rotation.md).

Needs exact uint64 arithmetic, so it runs on the host with Python ints. A sign vector depends only on
(seed, layer, global head, role, purpose, d): it is setup, computed once and cached, never per token.
"""
from __future__ import annotations

import functools

import mlx.core as mx

from ... import spec

_M64 = (1 << 64) - 1
_P = spec.formats()["prng"]
GAMMA = int(_P["gamma"], 16)
MUL1 = int(_P["mix_mul1"], 16)
MUL2 = int(_P["mix_mul2"], 16)
PURPOSE_ROTATION = int(_P["purpose_rotation"])
PURPOSE_QJL = int(_P["purpose_qjl"])


def mix64(z: int) -> int:
    z &= _M64
    z = ((z ^ (z >> 30)) * MUL1) & _M64
    z = ((z ^ (z >> 27)) * MUL2) & _M64
    return z ^ (z >> 31)


def next_word(state: int) -> tuple[int, int]:
    """SplitMix64 `next`: (new_state, word)."""
    state = (state + GAMMA) & _M64
    return state, mix64(state)


def stream_key(seed: int, layer: int, head: int, role: int, purpose: int) -> int:
    k = mix64(seed)
    k = mix64(k ^ layer)
    k = mix64(k ^ head)
    return mix64(k ^ (2 * role + purpose))


@functools.lru_cache(maxsize=4096)
def sign_list(seed: int, layer: int, head: int, role: int, purpose: int, d: int) -> tuple[float, ...]:
    """sigma_j = -1 if bit (j mod 64) of word j div 64 is set, else +1."""
    state = stream_key(seed, layer, head, role, purpose)
    out = []
    for _ in range(-(-d // 64)):
        state, w = next_word(state)
        out.extend(-1.0 if (w >> j) & 1 else 1.0 for j in range(64))
    return tuple(out[:d])


@functools.lru_cache(maxsize=1024)
def signs(seed: int, layer: int, head_offset: int, heads: int, role: int, purpose: int, d: int) -> mx.array:
    """Sign vectors of local heads 0..heads-1 (global head_offset + h), float32 of shape (heads, 1, d),
    ready to broadcast against (B, H, T, d)."""
    rows = [sign_list(seed, layer, head_offset + h, role, purpose, d) for h in range(heads)]
    return mx.array(rows, dtype=mx.float32).reshape(heads, 1, d)


def head_signs(params: spec.Params, heads: int, d: int, purpose: int = PURPOSE_ROTATION) -> mx.array:
    return signs(params.seed, params.layer, params.head_offset, heads, params.role_id, purpose, d)
