"""Number model in MLX ops (spec/number-model.md): exact upcast, halving fold, rint, input checks.

Every float op here is one MLX elementwise op on float32 arrays, i.e. one binary32 operation rounded once
(no mx.compile, so nothing is fused or contracted). Float reductions never use mx.sum: its summation
order differs by backend, the spec fixes the halving-fold tree.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import mlx.core as mx

from ... import spec

DTYPES: dict[str, mx.Dtype] = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


def dtype_name(dt) -> str:
    """The spec's name ("float16", "bfloat16", "float32") of an mx dtype or a name; ValueError otherwise."""
    if isinstance(dt, str):
        if dt in DTYPES:
            return dt
    else:
        for name, mdt in DTYPES.items():
            if dt == mdt:
                return name
    raise ValueError(f"dtype: {dt!r} is not supported; expected one of {', '.join(DTYPES)}")


def f32(v: float) -> mx.array:
    """A binary32 scalar constant as a float32 mx array (a Python float would be weakly typed)."""
    a = mx.array(float(v), dtype=mx.float32)
    if float(a.item()) != float(v):
        raise ValueError(f"constant {v!r} is not a binary32 value")
    return a


@functools.lru_cache(maxsize=None)
def scale(d: int) -> mx.array:
    """s_d (rotation.md) as a float32 scalar."""
    return f32(float(spec.scale(d)))


@functools.lru_cache(maxsize=None)
def qjl_scale(d: int) -> mx.array:
    """A_d (methods/turboquant_prod.md) as a float32 scalar."""
    return f32(float(spec.qjl_scale(d)))


@functools.lru_cache(maxsize=None)
def rint_magic() -> mx.array:
    return f32(float(spec.rint_magic()))


def upcast(x: mx.array) -> mx.array:
    """Exact upcast to binary32 (every fp16/bf16 value is representable)."""
    return x if x.dtype == mx.float32 else x.astype(mx.float32)


def fold(v: mx.array) -> mx.array:
    """The canonical reduction tree over the last axis, length d = m * n (number-model.md): the m blocks of
    n summed elementwise left to right (m > 1 only), then the halving fold w[i] += w[i + n/2], repeated."""
    try:
        m, n = spec.split_head_dim(v.shape[-1])
    except ValueError:
        raise ValueError(f"fold: length {v.shape[-1]} is not m * 2^k with m in {spec.HADAMARD_RADICES}") from None
    w = v[..., :n]
    for k in range(1, m):
        w = w + v[..., k * n:(k + 1) * n]
    while n > 1:
        n //= 2
        w = w[..., :n] + w[..., n:2 * n]
    return w[..., 0]


def norm(x32: mx.array) -> mx.array:
    """sqrt(fold(x*x)) over the last axis; squares first, each one rounding."""
    return mx.sqrt(fold(x32 * x32))


def rint(y: mx.array) -> mx.array:
    """Round half to even for 0 <= y <= 255, exactly: (y + 0x1.8p23) - 0x1.8p23 (two RNE adds)."""
    m = rint_magic()
    return (y + m) - m


def reciprocal_or_zero(n: mx.array) -> mx.array:
    """r = 1/n if n > 0 else 0 (the zero path of the norm methods); no division by zero is evaluated."""
    pos = n > 0
    one = f32(1.0)
    return mx.where(pos, one / mx.where(pos, n, one), f32(0.0))


def check_x(x, params: spec.Params, dtype=None, finite: bool = True) -> None:
    """Reject bad input before any state changes (number-model.md 'Special values'): ValueError naming x.
    `dtype`, if given, is the declared input dtype (interchange); x must have it.

    The finiteness test goes through `fault` (a host sync, or a deferred flag). `finite=False` leaves it to
    the caller (the fused encode kernel checks x in the pass that encodes it: accelerated.kernels).
    """
    if dtype is None and type(x) is mx.array and (x.shape, x.dtype, params) in _CHECKED:
        # shape, dtype and head dim already passed for this parameter set (every decode step asks again)
        if finite:
            fault_nonfinite(x, NONFINITE)
        return
    want = None if dtype is None else dtype_name(dtype)
    if not isinstance(x, mx.array):
        raise ValueError(f"x: must be an mx.array, got {type(x).__name__}")
    if x.dtype not in DTYPES.values():
        raise ValueError(f"x: dtype {x.dtype} is not supported; expected float16, bfloat16 or float32")
    if want is not None and dtype_name(x.dtype) != want:
        raise ValueError(f"x: dtype {dtype_name(x.dtype)} differs from the declared dtype {want}")
    if x.ndim != 4:
        raise ValueError(f"x: must have rank 4 (B, H, T, d), got shape {tuple(x.shape)}")
    if any(s == 0 for s in x.shape):
        raise ValueError(f"x: empty axis in shape {tuple(x.shape)}")
    params.check_head_dim(int(x.shape[-1]))
    if dtype is None and type(x) is mx.array and len(_CHECKED) < 4096:
        _CHECKED.add((x.shape, x.dtype, params))
    if finite:
        fault_nonfinite(x, NONFINITE)


_CHECKED: set = set()   # (shape, dtype, params) that passed check_x's shape, dtype and head-dim checks


NORM_OVERFLOW = "x: norm overflows binary32"   # the rule of the norm methods (their modules' RULE)


def check_norm_finite(n: mx.array) -> None:
    """Norm methods reject tokens whose sum of squares overflows binary32 (ValueError naming x)."""
    if n.size:
        fault_nonfinite(n, NORM_OVERFLOW)   # a norm is >= 0 or +Inf


# ---- data-dependent checks: now (one host sync each) or deferred (spec/streaming.md 'Deferred rejection')
# Shape, dtype and parameter checks always raise at once. The checks that need the data (finiteness, norm
# overflow, KIVI's float16 overflow, mlx_affine's span overflow) go through `fault` / `fault_nonfinite`:
# outside `deferred_checks()` they evaluate and raise (a host sync); inside, they only record a `Fault`
# (kind, array, message), so a caller can evaluate all of them later, in one launch, at a point where it
# synchronizes anyway (accelerated.kernels.faults.flags).
_DEFERRED: contextvars.ContextVar[list | None] = contextvars.ContextVar("veloxquant_deferred", default=None)
FAULT_KINDS = ("flag", "nonfinite")     # any element nonzero / any element NaN or +-Inf
NONFINITE = "x: contains NaN or Inf"     # the message of every path's NaN/Inf check of x


def fault(flag: mx.array, message: str) -> None:
    """`flag` (lazy; any nonzero element) means the input is rejected with ValueError(message)."""
    _record("flag", flag, message)


def fault_nonfinite(a: mx.array, message: str) -> None:
    """Any NaN or +-Inf in `a` means the input is rejected with ValueError(message)."""
    _record("nonfinite", a, message)


def fault_flag(kind: str, a: mx.array) -> mx.array:
    """The lazy bool scalar of one recorded check (MLX ops)."""
    if kind == "nonfinite":
        return mx.logical_not(mx.isfinite(a).all())
    return (a != 0).any()


def _record(kind: str, a: mx.array, message: str) -> None:
    pending = _DEFERRED.get()
    if pending is None:
        if fault_flag(kind, a).item():
            raise ValueError(message)
    else:
        pending.append((kind, a, message))


def deferring() -> bool:
    """True inside `deferred_checks()`."""
    return _DEFERRED.get() is not None


@contextlib.contextmanager
def deferred_checks():
    """Collect `fault` flags instead of evaluating them; yields the list of (flag, message) pairs."""
    pending: list = []
    token = _DEFERRED.set(pending)
    try:
        yield pending
    finally:
        _DEFERRED.reset(token)


def fault_flags(pending) -> mx.array:
    """The recorded checks as one lazy (n,) bool array (MLX ops: a few small ops per check)."""
    return mx.stack([fault_flag(kind, a) for kind, a, _ in pending])


def first_fault(pending, flags: mx.array | None = None) -> str | None:
    """The message of the first recorded check that fails (evaluates `flags`: one host sync), else None."""
    if not pending:
        return None
    hits = (fault_flags(pending) if flags is None else flags).tolist()
    return next((msg for (_, _, msg), hit in zip(pending, hits) if hit), None)


def rint_any(y: mx.array) -> mx.array:
    """Round half to even for any finite binary32 y: |y| >= 2^23 is already an integer; below that,
    (|y| + 2^23) - 2^23 rounds |y| (ulp 1 in [2^23, 2^24), 2^23 even so ties go to even), sign restored."""
    two23 = f32(8388608.0)
    a = mx.abs(y)
    r = (a + two23) - two23
    return mx.where(a < two23, mx.where(y < f32(0.0), -r, r), y)
