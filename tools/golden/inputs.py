"""Golden-vector inputs: exact dtype casts and a private counter-based RNG (SplitMix64, integers only), so
inputs never depend on numpy's Generator streams or libm and `golden check` rebuilds them bit for bit."""
from __future__ import annotations

import hashlib

import numpy as np

def bf16_round(f32: np.ndarray) -> np.ndarray:
    """binary32 -> bfloat16 bit patterns, RNE (finite inputs; used to build inputs only)."""
    b = np.ascontiguousarray(f32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def cast_input(v: np.ndarray, dtype: str) -> np.ndarray:
    """float64/float32 values (exactly binary32) to the interchange array of `dtype`, RNE."""
    f32 = np.asarray(v, dtype=np.float32)
    if dtype == "float32":
        return f32.copy()
    if dtype == "float16":
        return f32.astype(np.float16)
    if dtype == "bfloat16":
        return bf16_round(f32)
    raise ValueError(f"dtype: {dtype!r}")


def upcast(x: np.ndarray, dtype: str) -> np.ndarray:
    return bf16_to_f32(x) if dtype == "bfloat16" else np.asarray(x, dtype=np.float32)


# ----------------------------------------------------------------------------------------------------
# Input RNG: SplitMix64 over a counter, integers only, so inputs never depend on numpy's RNG or libm.

_M64 = (1 << 64) - 1


def _mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class InputRng:
    """Deterministic input generator keyed by a string (the case id)."""

    def __init__(self, key: str):
        self.state = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")

    def u64(self, n: int) -> np.ndarray:
        ctr = np.arange(1, n + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            out = _mix64(np.uint64(self.state) + ctr * np.uint64(0x9E3779B97F4A7C15))
        self.state = (self.state + n * 0x9E3779B97F4A7C15) & _M64
        return out

    def ints(self, n: int, lo: int, hi: int) -> np.ndarray:
        """n integers in [lo, hi] (modulo bias is irrelevant for test inputs)."""
        return (self.u64(n) % np.uint64(hi - lo + 1)).astype(np.int64) + lo

    def normalish(self, shape) -> np.ndarray:
        """Irwin-Hall sum of four 16-bit uniforms, centred: sd ~1.15, every value exact (19 bits)."""
        n = int(np.prod(shape))
        w = self.u64(n)
        s = sum(((w >> np.uint64(16 * i)) & np.uint64(0xFFFF)).astype(np.int64) for i in range(4))
        return ((s - 131070).astype(np.float64) * 2.0 ** -15).reshape(shape)


def random_input(key: str, shape, dtype: str, profile: str) -> np.ndarray:
    """Random KV-like values; profiles add outlier channels or change the scale, all steps exact."""
    rng = InputRng(key)
    v = rng.normalish(shape)
    d = shape[-1]
    if profile == "outliers":  # a few key channels much larger than the rest, plus a channel offset
        ch = rng.ints(3, 0, d - 1)
        v[..., ch] *= 2.0 ** 5
        v += rng.normalish((1, shape[1], 1, d)) * 0.5
    elif profile == "small":
        v *= 2.0 ** -11
    elif profile == "large":
        v *= 2.0 ** 7
    return cast_input(v, dtype)


PROFILES = ("normal", "outliers", "small", "large")
