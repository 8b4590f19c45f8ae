"""accelerated.kernels on a GPU, bit for bit against accelerated.ops (spec/methods/*.md).

accelerated.ops is the bit-exact MLX path (conformance-checked against the reference on CPU and CUDA); the
kernels must store and decode the same bits for every method, bits, head dim, dtype, window and stride
layout, and reject bad input with the same error (the fault flags of the encode kernel, raised now or
recorded in numerics.deferred_checks()). Where no kernels can run (no Metal/CUDA, CPU device) everything
skips with the reason.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import kernels, ops
from veloxquant.accelerated.kernels import methods as km
from veloxquant.accelerated.ops import numerics
from veloxquant.accelerated.stream import Stream

from _faults import fault_inputs  # noqa: E402  (tests/ is on sys.path under pytest)

OK, WHY = kernels.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"kernels unavailable: {WHY}")

DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
METHOD_BITS = [("turboquant", dict(bits=b)) for b in (1, 2, 3, 4)] + \
              [("turboquant_rvq", dict(bits=b, bits2=b2)) for b in (1, 2, 3, 4) for b2 in (1, 2, 3, 4)] + \
              [("rabitq", dict())] + [("turboquant_prod", dict(bits=b)) for b in (2, 3, 4, 5)] + \
              [("kivi", dict(bits=b, group_size=g, role=r)) for b, g, r in
               ((1, 16, "k"), (2, 32, "v"), (3, 64, "k"), (4, 16, "v"), (5, 128, "v"), (6, 32, "k"), (7, 16, "v"),
                (8, 64, "v"))] + \
              [("mlx_affine", dict(bits=b, group_size=g)) for b in (2, 4, 8) for g in (32, 64, 128)]
HEAD_DIMS = [16, 32, 64, 128, 256, 512, 1024]
# spec 1.1: d = m * 2^k, m = 12, 20, 28; every input dtype at 80, 96, 192, 320, bfloat16 at the others
NEW_HEAD_DIMS = [(d, dt) for d in (80, 96, 192, 320) for dt in ("bfloat16", "float16", "float32")] + \
                [(d, "bfloat16") for d in (20, 112, 160, 768, 896)]
HEAD_DIM_CASES = [("turboquant", dict(bits=3)), ("turboquant_rvq", dict(bits=2, bits2=3)), ("rabitq", dict()),
                  ("turboquant_prod", dict(bits=4)), ("kivi", dict(bits=3, group_size=16, role="k")),
                  ("kivi", dict(bits=4, group_size=16, role="v")), ("mlx_affine", dict(bits=4, group_size=32))]


def _u(a: mx.array) -> np.ndarray:
    """Bit patterns of an mx array (for exact comparison and XOR reports)."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16))
    n = np.array(a)
    return n.view({4: np.uint32, 2: np.uint16}[n.itemsize]) if n.dtype.kind == "f" else n


def assert_same(got: dict | mx.array, want: dict | mx.array, what: str = "") -> None:
    if isinstance(want, dict):
        assert list(got) == list(want), (list(got), list(want))
        for k in want:
            assert_same(got[k], want[k], f"{what}.{k}")
        return
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    g, w = _u(got), _u(want)
    x = g ^ w
    assert not x.any(), f"{what}: {np.count_nonzero(x)} of {x.size} differ; XOR bits {np.unique(x)[:8]}"


def _x(rng, shape, dtype) -> mx.array:
    x = rng.standard_normal(shape).astype(np.float32)
    x[..., 0, :] = 0.0                                           # zero token
    if shape[2] > 1:
        x[..., 1, :] = np.where(np.arange(shape[3]) % 2, 1e-40, -0.0)   # subnormal fp32 / -0
    if shape[2] > 2:
        x[..., 2, :] *= 300.0
    return mx.array(x).astype(DTYPES[dtype])


def _check(method, kw, shape, dtype, seed=0, window=None):
    rng = np.random.default_rng(seed)
    p = spec.Params(method, seed=11, layer=2, head_offset=3, window=window, **{"role": "k", **kw})
    x = _x(rng, shape, dtype)
    if method == "kivi":   # float16 scales: keep the x2 300 token inside float16's range
        x = mx.clip(x, -6e4, 6e4)
    want = ops.encode(x, p, dtype)
    got = kernels.encode(x, p, dtype)
    assert_same(got, want, f"{method}{kw} {shape} {dtype} encode")
    assert_same(kernels.decode(want, p, dtype), ops.decode(want, p, dtype), f"{method}{kw} {shape} {dtype} decode")


@pytest.mark.parametrize("method,kw", METHOD_BITS, ids=[f"{m}-{'-'.join(map(str, k.values()))}" for m, k in METHOD_BITS])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_bits_and_dtypes(method, kw, dtype):
    t = 2 * kw.get("group_size", 0) + 5 if method == "kivi" else 5
    _check(method, kw, (2, 3, t, 128), dtype, window=2)


@pytest.fixture
def specialized(monkeypatch, tune):
    """Every launch specialized (specialize_rows=0); the per-shape launch caches emptied before and after
    (they hold the template a launch was first planned with)."""
    from veloxquant.accelerated.kernels import append as fused
    tune(specialize_rows=0)
    for f in (km._encode_static, fused._static_for):
        f.cache_clear()
    yield monkeypatch
    for f in (km._encode_static, fused._static_for):
        f.cache_clear()


@pytest.mark.parametrize("method,kw", METHOD_BITS, ids=[f"{m}-{'-'.join(map(str, k.values()))}" for m, k in METHOD_BITS])
def test_specialized_launches(method, kw, specialized):
    """Launches of tuning's specialize_rows rows and more compile their code widths, group size and KIVI role in;
    the small launches of the other tests (and of the conformance suite) read them from meta. Here every
    launch is specialized: the same bits as accelerated.ops for every configuration, at d = 128 and 80."""
    t = 2 * kw.get("group_size", 0) + 5 if method == "kivi" else 5
    _check(method, kw, (2, 3, t, 128), "float16", window=2)
    if method != "mlx_affine" and not (method == "kivi" and 80 % kw["group_size"]):
        _check(method, kw, (1, 2, 2 * kw.get("group_size", 0) + 3 if method == "kivi" else 5, 80), "bfloat16",
               seed=3, window=0)


def test_specialized_check_catches_wrong_constants(specialized):
    """The comparison above has teeth: a specialized launch told the wrong code width stores other bits."""
    specialized.setattr(km, "code_constants", lambda p: (2, 1, 1, 0))     # turboquant b3 compiled as b2
    with pytest.raises(AssertionError, match="differ"):
        _check("turboquant", dict(bits=3), (2, 3, 5, 128), "float16", window=2)


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("method,kw", HEAD_DIM_CASES)
def test_head_dims(method, kw, d):
    if method == "mlx_affine" and d < 32:
        pytest.skip("mlx_affine: G >= 32 > d")
    _check(method, kw, (1, 2, 36 if method == "kivi" else 4, d), "bfloat16", seed=d, window=0)


@pytest.mark.parametrize("d,dtype", NEW_HEAD_DIMS, ids=[f"d{d}-{dt}" for d, dt in NEW_HEAD_DIMS])
@pytest.mark.parametrize("method,kw", HEAD_DIM_CASES)
def test_new_head_dims(method, kw, d, dtype):
    """Spec 1.1's head dims (stage B of H, the block fold), every input dtype; the kernel itself runs (no
    fall back to accelerated.ops: launch_shape accepts d)."""
    if (method == "mlx_affine" or kw.get("role") == "v") and d % kw["group_size"]:
        pytest.skip(f"group size {kw['group_size']} does not divide d = {d} (spec 1.1: G | d)")
    km.launch_shape(8, d)
    _check(method, kw, (1, 2, 36 if method == "kivi" else 5, d), dtype, seed=d, window=1)
    if method != "kivi":      # 32 rows: the largest single threadgroup (32 warps failed to launch at d = 80 / 96)
        _check(method, kw, (1, 4, 8, d), dtype, seed=d + 1, window=0)


@pytest.mark.parametrize("method", ["turboquant", "turboquant_rvq", "rabitq", "turboquant_prod", "kivi",
                                    "mlx_affine"])
def test_window_and_many_tokens(method):
    kw = dict(group_size=16) if method == "kivi" else dict(group_size=32) if method == "mlx_affine" else {}
    _check(method, kw, (1, 4, 300, 64), "float16", window=37)
    _check(method, kw, (2, 2, 9, 32), "float32", window=20)   # everything in the window: Q = 0


def test_strided_input():
    """A transposed view (tokens and heads swapped in memory) is read through its strides."""
    rng = np.random.default_rng(5)
    base = mx.array(rng.standard_normal((2, 7, 3, 64)).astype(np.float32)).astype(mx.float16)
    x = base.transpose(0, 2, 1, 3)
    p = spec.Params("turboquant", bits=2)
    assert_same(kernels.encode(x, p), ops.encode(mx.contiguous(x), p), "strided")


def test_norm_overflow_rejected():
    x = mx.full((1, 1, 2, 16), 3e38, dtype=mx.float32)
    with pytest.raises(ValueError, match="x"):
        kernels.encode(x, spec.Params("turboquant"))


def _poisoned(method, t=40):
    """(x, its rule-breaking copy, the copy with NaN in a window token too) for `method`, float32."""
    x = np.random.default_rng(3).standard_normal((2, 3, t, 64)).astype(np.float32)
    return (x, *fault_inputs(method, x))


@pytest.mark.parametrize("method", ["turboquant", "turboquant_rvq", "rabitq", "turboquant_prod", "kivi",
                                    "mlx_affine"])
def test_faults_like_ops(method):
    """The same ValueError (message and precedence) as accelerated.ops, raised at once; inside
    deferred_checks() recorded as lazy flags whose first set one names the same error."""
    kw = dict(group_size=16) if method == "kivi" else {}
    p = spec.Params(method, window=3, **kw)
    x, rule, both = _poisoned(method)
    for arr, msg in ((rule, km.RULES[method]), (both, km.NONFINITE)):
        with pytest.raises(ValueError) as want:
            ops.encode(mx.array(arr), p)
        assert str(want.value) == msg
        with pytest.raises(ValueError) as got:
            kernels.encode(mx.array(arr), p)
        assert str(got.value) == msg
        with numerics.deferred_checks() as pending:
            kernels.encode(mx.array(arr), p)
        assert numerics.first_fault(pending) == msg
    with numerics.deferred_checks() as pending:
        kernels.encode(mx.array(x), p)
    assert numerics.first_fault(pending) is None


def test_decode_step_one_launch_one_slot():
    """A decode step (B=1, H=8, one token) is one threadgroup: its fault flags are views of the kernel's
    output, with no reduction launched after it."""
    p = spec.Params("turboquant", bits=4, window=0).resolved()
    x = mx.random.normal((1, 8, 1, 128)).astype(mx.float16)
    fields, flags = km.method("turboquant").encode_launch(x, p, 1, 0)
    assert km.launch_shape(8, 128)[2] == 1
    mx.eval(list(fields.values()), *flags)
    assert not flags[0].item() and not flags[1].item()
    assert_same(fields, {k: v for k, v in ops.encode(x, p).items() if k != "window"}, "decode step")


@pytest.mark.parametrize("method", ["turboquant", "turboquant_prod", "kivi", "mlx_affine"])
def test_stream_through_kernels(method):
    """Chunked appends through kernels store the bytes of accelerated.ops's stream and of one-shot encode."""
    rng = np.random.default_rng(9)
    p = spec.Params(method, window=5, **(dict(group_size=16) if method == "kivi" else {}))
    x = _x(rng, (1, 2, 70, 64), "bfloat16")
    a, b = Stream(p, use_kernels=True), Stream(p, use_kernels=False)
    for lo, hi in [(0, 1), (1, 40), (40, 41), (41, 70)]:
        a.append(x[:, :, lo:hi])
        b.append(x[:, :, lo:hi])
    assert_same(a.record(), b.record(), f"{method} stream")
    assert_same(a.record(), ops.encode(x, p), f"{method} stream vs one-shot")
    assert_same(a.dequantized(), b.dequantized(), f"{method} stream dequantized")
