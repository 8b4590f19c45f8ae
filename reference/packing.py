"""Packing codes into uint32 words, LSB-first, codes never straddling words (spec/packing.md)."""
from __future__ import annotations

import numpy as np

from .. import spec


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack the last axis (n codes, 0 <= c < 2^bits) into W = ceil(n / (32 div bits)) uint32 words."""
    codes = np.asarray(codes)
    if not 1 <= bits <= 8:
        raise ValueError(f"bits: {bits} is outside 1..8")
    if codes.size and (codes.min() < 0 or codes.max() >= (1 << bits)):
        raise ValueError(f"codes: values outside [0, {1 << bits}) for bits={bits}")
    n = codes.shape[-1]
    k = 32 // bits
    w = spec.words_per_row(n, bits)
    lead = codes.shape[:-1]
    # Zero-pad to W*k slots so the unused slots of the last word stay zero.
    padded = np.zeros(lead + (w * k,), dtype=np.uint32)
    padded[..., :n] = codes
    shifts = (np.uint32(bits) * np.arange(k, dtype=np.uint32))
    slots = padded.reshape(lead + (w, k)) << shifts
    return np.bitwise_or.reduce(slots, axis=-1).astype(np.uint32)


def unpack(words: np.ndarray, bits: int, n: int) -> np.ndarray:
    """c_j = (word[j div k] >> (bits * (j mod k))) & (2^bits − 1), for j < n. uint32."""
    words = np.asarray(words, dtype=np.uint32)
    k = 32 // bits
    shifts = (np.uint32(bits) * np.arange(k, dtype=np.uint32))
    mask = np.uint32((1 << bits) - 1)
    slots = (words[..., :, None] >> shifts) & mask
    return slots.reshape(words.shape[:-1] + (words.shape[-1] * k,))[..., :n]
