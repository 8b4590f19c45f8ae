"""Exact comparison helpers: bit-exact or not, and exactly where.

Every message starts with `what` (the function and its arguments, written by the caller) and says how
many elements differ, the first differing index, both values in hex, the XOR popcount, and for packed
uint32 words the worst block (the row of words with the most differing bits).
"""
from __future__ import annotations

import numpy as np

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class Mismatch(AssertionError):
    """A bit-exact comparison failed. `.differing` is the element count (0 for shape/dtype/field errors)."""

    def __init__(self, message: str, differing: int = 0):
        super().__init__(message)
        self.differing = differing


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(_UINT[a.dtype.itemsize])


def _popcount(a: np.ndarray) -> np.ndarray:
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(a).astype(np.int64)
    a = a.astype(np.uint64)
    return np.array([bin(int(v)).count("1") for v in a.ravel()], dtype=np.int64).reshape(a.shape)


def _fmt(v, dtype: np.dtype, bits) -> str:
    width = dtype.itemsize * 2
    h = f"0x{int(bits):0{width}X}"
    if dtype.kind == "f":
        return f"{h} ({float(v).hex()}, {float(v)!r})"
    if dtype == np.uint16:
        return f"{h} (bf16 pattern or uint16 {int(v)})"
    return f"{h} ({int(v)})"


def describe_difference(actual: np.ndarray, expected: np.ndarray, *, packed: bool = False) -> tuple[int, str]:
    """(number of differing elements, description); (0, "") when bit-identical. Shapes/dtypes must match."""
    ab, eb = _bits(actual), _bits(expected)
    diff = ab != eb
    n = int(diff.sum())
    if n == 0:
        return 0, ""
    x = ab ^ eb
    pc = _popcount(x)
    flat = int(np.flatnonzero(diff.ravel())[0])
    idx = tuple(int(i) for i in np.unravel_index(flat, actual.shape))
    every = ("; every element differs: suspect the randomness (seed, layer, head_offset, role), the parameters "
             "or the layout rather than the arithmetic") if n == actual.size and n > 8 else ""
    lines = [
        f"{n} of {actual.size} elements differ{every}; XOR popcount total {int(pc.sum())} bits",
        f"first differing index {idx}: actual {_fmt(actual[idx], actual.dtype, ab[idx])}, "
        f"expected {_fmt(expected[idx], expected.dtype, eb[idx])}, XOR 0x{int(x[idx]):X} "
        f"({int(pc[idx])} bits)",
    ]
    if packed and actual.ndim >= 1:
        rows = pc.reshape(-1, actual.shape[-1]).sum(axis=1)
        worst = int(np.argmax(rows))
        ridx = tuple(int(i) for i in np.unravel_index(worst, actual.shape[:-1])) if actual.ndim > 1 else ()
        words = int((diff.reshape(-1, actual.shape[-1])[worst]).sum())
        lines.append(f"worst block: row {ridx} (words [..., :]) with {int(rows[worst])} differing bits "
                     f"in {words} of {actual.shape[-1]} words; {int((rows > 0).sum())} rows differ")
    return n, "\n  ".join(lines)


def assert_exact(actual, expected, what: str, *, packed: bool = False) -> None:
    """Bit-exact equality of two arrays (shape, dtype and every bit)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.dtype != expected.dtype:
        raise Mismatch(f"{what}: dtype {actual.dtype} != expected {expected.dtype}")
    if actual.shape != expected.shape:
        raise Mismatch(f"{what}: shape {actual.shape} != expected {expected.shape}")
    n, msg = describe_difference(actual, expected, packed=packed)
    if n:
        raise Mismatch(f"{what}: not bit-exact\n  {msg}", n)


def assert_record_exact(actual: dict, expected: dict, what: str) -> None:
    """Same field names in the same order, each field bit-exact; uint32 fields are packed words."""
    if list(actual) != list(expected):
        raise Mismatch(f"{what}: record fields {list(actual)} != expected {list(expected)}")
    failures = []
    total = 0
    for k in expected:
        a, e = np.asarray(actual[k]), np.asarray(expected[k])
        try:
            assert_exact(a, e, f"{what} field {k!r}", packed=e.dtype == np.uint32)
        except Mismatch as m:
            failures.append(str(m))
            total += m.differing
    if failures:
        raise Mismatch("\n".join(failures), total)


def call_desc(fn: str, params=None, dtype: str | None = None, shape=None, **extra) -> str:
    """`fn(method, bits=.., ..., dtype=.., shape=..)`: how messages name a call."""
    parts = []
    if params is not None:
        d = params.to_dict() if hasattr(params, "to_dict") else dict(params)
        method = d.pop("method", None)
        if method:
            parts.append(method)
        parts += [f"{k}={v!r}" for k, v in d.items()]
    if dtype is not None:
        parts.append(f"dtype={dtype}")
    if shape is not None:
        parts.append(f"shape={tuple(shape)}")
    parts += [f"{k}={v!r}" for k, v in extra.items()]
    return f"{fn}({', '.join(parts)})"
