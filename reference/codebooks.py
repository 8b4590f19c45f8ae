"""Codebook tables scaled to head dim d, quantization by counting strict crossings (spec/codebooks.md)."""
from __future__ import annotations

import numpy as np

from .. import spec


def scaled(book: spec.Codebook, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(C_d, B_d): centroids and boundaries times s_d, one binary32 multiply each."""
    s = spec.scale(d)
    return book.centroids * s, book.boundaries * s


def gaussian(bits: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Stage-1 / MSE table gaussian[bits] at head dim d."""
    return scaled(spec.gaussian(bits), d)


def residual(bits: int, bits2: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """turboquant_rvq stage-2 table residual[bits][bits2] at head dim d."""
    return scaled(spec.residual(bits, bits2), d)


def quantize(u: np.ndarray, boundaries: np.ndarray) -> np.ndarray:
    """Index = number of boundaries k with u > B_d[k] (strict IEEE >: a tie is not a crossing). uint32."""
    u = np.asarray(u, dtype=np.float32)
    idx = np.zeros(u.shape, dtype=np.uint32)
    for b in boundaries:  # K − 1 <= 15 boundaries
        idx += u > b
    return idx


def dequantize(idx: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """C_d[i] (a table look-up, exact)."""
    return centroids[idx]
