"""Test inputs in the numpy interchange: shapes, dtypes and value regimes (none of this quantizes).

Values are drawn with numpy from a seed that hypothesis chooses, so failures replay and shrink cheaply.
"""
from __future__ import annotations

import numpy as np

REGIMES = ("normal", "scaled", "huge", "tiny", "subnormal", "zeros", "raw", "mixed", "grid")


def to_dtype(v32: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values -> interchange array of `dtype`. bf16 keeps the top 16 bits (any pattern is a valid
    input; rounding is irrelevant for test data). Non-finite results become 0 (finite regimes stay finite)."""
    v32 = np.asarray(v32, dtype=np.float32)
    if dtype == "float32":
        out = v32.copy()
    elif dtype == "float16":
        with np.errstate(over="ignore"):
            out = v32.astype(np.float16)
    elif dtype == "bfloat16":
        out = (v32.view(np.uint32) >> 16).astype(np.uint16)
    else:
        raise ValueError(dtype)
    f = upcast(out, dtype)
    out[~np.isfinite(f)] = 0
    return out


def upcast(x: np.ndarray, dtype: str) -> np.ndarray:
    """Exact binary32 view of interchange values (for generating data and float64 oracles only)."""
    if dtype == "bfloat16":
        return (np.asarray(x, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(x).astype(np.float32)


def finfo_max(dtype: str) -> float:
    return {"float16": 65504.0, "bfloat16": 3.3895e38, "float32": 3.4028e38}[dtype]


def make_x(rng: np.random.Generator, shape, dtype: str, regime: str) -> np.ndarray:
    """A (B, H, T, d) input of `dtype` in a value regime.

    huge: near the dtype's top (norms may overflow binary32: both sides must then reject);
    tiny/subnormal: squares underflow, subnormal inputs; zeros: all-zero tokens and signed zeros;
    raw: random bit patterns of the dtype (all finite ones, every exponent); grid: small integers and
    halves (exact ties for KIVI's rint); mixed: a different regime per token."""
    shape = tuple(shape)
    if regime == "mixed":
        out = np.empty(shape, dtype=to_dtype(np.zeros(1, np.float32), dtype).dtype)
        subs = [r for r in REGIMES if r != "mixed"]
        for t in range(shape[2]):
            r = subs[int(rng.integers(len(subs)))]
            out[:, :, t:t + 1] = make_x(rng, shape[:2] + (1,) + shape[3:], dtype, r)
        return out
    g = rng.standard_normal(shape).astype(np.float32)
    if regime == "normal":
        v = g
    elif regime == "scaled":
        v = g * np.float32(2.0 ** int(rng.integers(-20, 21)))
    elif regime == "huge":
        top = finfo_max(dtype)
        v = (g / np.float32(4)).clip(-1, 1) * np.float32(top)
    elif regime == "tiny":
        lo = {"float16": -24, "bfloat16": -133, "float32": -149}[dtype]
        v = g * np.float32(2.0 ** int(rng.integers(lo, lo + 40)))
    elif regime == "subnormal":
        top = {"float16": 2.0 ** -14, "bfloat16": 2.0 ** -126, "float32": 2.0 ** -126}[dtype]
        v = rng.uniform(-1, 1, shape).astype(np.float32) * np.float32(top)
    elif regime == "zeros":
        v = np.where(rng.random(shape) < 0.5, np.float32(0.0), np.float32(-0.0)).astype(np.float32)
        if shape[2] > 1:  # keep one non-zero token so zero and non-zero paths meet in one call
            v[:, :, 0] = g[:, :, 0]
    elif regime == "grid":
        L = int(rng.integers(1, 256))
        v = (rng.integers(0, 2 * L + 1, shape).astype(np.float32) * np.float32(0.5)
             * np.float32(2.0 ** int(rng.integers(-4, 5))) - np.float32(int(rng.integers(0, 8))))
    elif regime == "raw":
        if dtype == "float32":
            # full mantissa, exponents in a range whose squares neither all overflow nor all vanish
            e = rng.integers(-70, 60, shape).astype(np.float32)
            v = rng.uniform(1, 2, shape).astype(np.float32) * np.exp2(e).astype(np.float32)
            v = np.where(rng.random(shape) < 0.5, -v, v).astype(np.float32)
        else:
            bits = rng.integers(0, 1 << 16, shape, dtype=np.uint32).astype(np.uint16)
            x = bits if dtype == "bfloat16" else bits.view(np.float16)
            f = upcast(x, dtype)
            x = x.copy()
            x[~np.isfinite(f)] = 0
            return x
    else:
        raise ValueError(regime)
    return to_dtype(v, dtype)


