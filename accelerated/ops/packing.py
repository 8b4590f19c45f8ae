"""Pack codes into uint32 words, LSB-first, codes never straddle words (spec/packing.md)."""
from __future__ import annotations

import functools

import mlx.core as mx


@functools.lru_cache(maxsize=None)
def _shifts(bits: int) -> mx.array:
    k = 32 // bits
    return mx.array([bits * j for j in range(k)], dtype=mx.uint32)


def words(n: int, bits: int) -> int:
    """W_b(n) = ceil(n / (32 div b))."""
    return -(-n // (32 // bits))


def pack(codes: mx.array, bits: int) -> mx.array:
    """(..., n) codes < 2^bits -> (..., W_b(n)) uint32 words; unused slots and high bits are zero."""
    codes = codes.astype(mx.uint32)
    k = 32 // bits
    *lead, n = codes.shape
    w = words(n, bits)
    if w * k != n:  # zero codes fill the last word's free slots
        codes = mx.concatenate([codes, mx.zeros((*lead, w * k - n), dtype=mx.uint32)], axis=-1)
    fields = codes.reshape(*lead, w, k) << _shifts(bits)
    # The fields occupy disjoint bits, so their integer sum equals their OR (no carries): exact.
    return fields.sum(axis=-1).astype(mx.uint32)


def unpack(words_: mx.array, bits: int, n: int) -> mx.array:
    """(..., W) uint32 words -> (..., n) uint32 codes: (word >> (b * slot)) & (2^b - 1)."""
    k = 32 // bits
    *lead, w = words_.shape
    mask = mx.array((1 << bits) - 1, dtype=mx.uint32)
    codes = (words_[..., None] >> _shifts(bits)) & mask
    return codes.reshape(*lead, w * k)[..., :n]
