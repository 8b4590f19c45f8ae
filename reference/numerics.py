"""Number model (spec/number-model.md): exact upcast, RNE downcasts, the halving fold, rint, input checks.

Every binary32 step here operates on np.float32 arrays and np.float32 scalars only, so numpy never
promotes to float64 (a Python float scalar would be harmless under NEP 50, but we do not rely on it).
numpy's elementwise +, -, *, /, sqrt are separately rounded IEEE binary32 operations (no FMA).
"""
from __future__ import annotations

import numpy as np

from .. import spec

F32 = np.float32
ZERO = np.float32(0.0)
ONE = np.float32(1.0)

# numpy container of each input dtype: bfloat16 arrives as uint16 bit patterns (docs/interfaces.md).
STORAGE = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(np.uint16), "float32": np.dtype(np.float32)}


def check_dtype(dtype) -> str:
    if not isinstance(dtype, str) or dtype not in STORAGE:
        raise ValueError(f"dtype: must be one of {', '.join(STORAGE)}, got {dtype!r}")
    return dtype


def upcast(x: np.ndarray, dtype: str) -> np.ndarray:
    """Exact conversion of input-dtype values to binary32 (every fp16/bf16 value is representable)."""
    if dtype == "bfloat16":
        # A bf16 value is the top half of the binary32 with the same sign/exponent/fraction bits.
        return (np.asarray(x, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return np.asarray(x, dtype=STORAGE[dtype]).astype(np.float32)


def to_float16(v: np.ndarray) -> np.ndarray:
    """binary32 -> float16 with RNE; beyond range gives ±Inf (numpy's conversion is IEEE RNE)."""
    with np.errstate(over="ignore"):  # overflow to ±Inf is the IEEE result we want
        return np.asarray(v, dtype=np.float32).astype(np.float16)


def to_bfloat16_bits(v: np.ndarray) -> np.ndarray:
    """binary32 -> bfloat16 bit patterns (uint16) with RNE; overflow rounds to ±Inf as IEEE prescribes."""
    u = np.asarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
    lsb = (u >> np.uint64(16)) & np.uint64(1)
    rounded = ((u + np.uint64(0x7FFF) + lsb) >> np.uint64(16)).astype(np.uint16)
    # NaN never reaches here in the bit-exact tier; keep it NaN (quiet) rather than rounding into Inf.
    nan = np.isnan(np.asarray(v, dtype=np.float32))
    return np.where(nan, ((u >> np.uint64(16)).astype(np.uint16) | np.uint16(0x0040)), rounded)


def downcast(v: np.ndarray, dtype: str) -> np.ndarray:
    """binary32 -> the input dtype's storage (RNE): float16, bf16 bit patterns, or float32 unchanged."""
    if dtype == "float16":
        return to_float16(v)
    if dtype == "bfloat16":
        return to_bfloat16_bits(v)
    return np.asarray(v, dtype=np.float32).copy()


def fold(v: np.ndarray) -> np.ndarray:
    """The canonical reduction tree over the last axis, length d = m * n (number-model.md):
    1. block fold (m > 1 only): w = v[0:n], then w = w + v[k n:(k+1) n] for k = 1 .. m-1 (elementwise);
    2. halving fold of w: w[i] += w[i + n/2], one add each, until one value is left.
    For a power-of-two length (m = 1) step 1 does nothing: the v1.0 halving fold."""
    v = np.asarray(v, dtype=np.float32)
    try:
        m, n = spec.split_head_dim(v.shape[-1])
    except ValueError:
        raise ValueError(f"fold: length {v.shape[-1]} is not m * 2^k with m in {spec.HADAMARD_RADICES}") from None
    w = v[..., :n]
    for k in range(1, m):
        w = w + v[..., k * n:(k + 1) * n]
    while n > 1:
        n //= 2
        w = w[..., :n] + w[..., n:]
    return w[..., 0]


def norm(v: np.ndarray) -> np.ndarray:
    """sqrt(fold(v * v)) over the last axis: squares first (one rounding each), then the fold, then sqrt."""
    v = np.asarray(v, dtype=np.float32)
    with np.errstate(over="ignore"):  # an overflowing square gives +Inf, which callers reject
        return np.sqrt(fold(v * v))


RINT_MAGIC = spec.rint_magic()  # 0x1.8p+23


def rint(y: np.ndarray) -> np.ndarray:
    """Round half to even for 0 <= y <= 255 via two RNE adds: (y + 0x1.8p23) - 0x1.8p23."""
    y = np.asarray(y, dtype=np.float32)
    return (y + RINT_MAGIC) - RINT_MAGIC


def reciprocal_or_zero(n: np.ndarray) -> np.ndarray:
    """r = 1 / n where n > 0, else 0 (turboquant.md step 3); one correctly rounded division."""
    n = np.asarray(n, dtype=np.float32)
    return np.divide(ONE, n, out=np.zeros_like(n), where=n > ZERO)


def check_norm_finite(n: np.ndarray) -> None:
    """Reject a +Inf norm (number-model.md 'Special values')."""
    if np.isinf(n).any():
        raise ValueError("x: norm overflows binary32 (a token's sum of squares is +Inf)")


def check_x(x, dtype, params: spec.Params | None = None) -> np.ndarray:
    """Validate x (B, H, T, d) in `dtype`; return its exact binary32 upcast. ValueError names `x`/`dtype`,
    or `group_size` when the (resolved) params' group size does not fit d. The order of the checks is
    number-model.md's 'Which error is reported': dtype, then x's type, dtype, rank, axes and head dim, then
    the group size against d, then x's values."""
    check_dtype(dtype)
    if not isinstance(x, np.ndarray):
        raise ValueError(f"x: must be a numpy array, got {type(x).__name__}")
    if x.dtype != STORAGE[dtype]:
        raise ValueError(f"x: array dtype {x.dtype} does not match dtype {dtype!r} "
                         f"(expected numpy {STORAGE[dtype]})")
    if x.ndim != 4:
        raise ValueError(f"x: must have rank 4 (B, H, T, d), got shape {x.shape}")
    if min(x.shape) == 0:
        raise ValueError(f"x: every axis must be non-empty, got shape {x.shape}")
    if x.shape[3] not in spec.HEAD_DIMS:
        raise ValueError(f"x: head dim {x.shape[3]} is not supported; expected one of {spec.HEAD_DIMS}")
    if params is not None:
        params.check_head_dim(x.shape[3])
    xf = upcast(x, dtype)
    if not np.isfinite(xf).all():
        raise ValueError("x: contains NaN or Inf")
    return xf
