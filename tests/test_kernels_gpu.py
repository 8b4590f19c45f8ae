"""accelerated.kernels on a GPU, bit for bit against accelerated.ops (spec/methods/turboquant*.md, rabitq.md).

accelerated.ops is the bit-exact MLX path (conformance-checked against the reference on CPU and CUDA); the
kernels must store and decode the same bits for every method, bits, head dim, dtype, window and stride
layout. Where no kernels can run (no Metal/CUDA, CPU device) everything skips with the reason.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import spec
from accelerated import kernels, ops
from accelerated.stream import Stream

OK, WHY = kernels.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"kernels unavailable: {WHY}")

DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
METHOD_BITS = [("turboquant", dict(bits=b)) for b in (1, 2, 3, 4)] + \
              [("turboquant_rvq", dict(bits=b, bits2=b2)) for b in (1, 2, 3, 4) for b2 in (1, 2, 3, 4)] + \
              [("rabitq", dict())] + [("turboquant_prod", dict(bits=b)) for b in (2, 3, 4, 5)]
HEAD_DIMS = [16, 32, 64, 128, 256, 512, 1024]


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
    p = spec.Params(method, seed=11, layer=2, head_offset=3, role="k", window=window, **kw)
    x = _x(rng, shape, dtype)
    want = ops.encode(x, p, dtype)
    got = kernels.encode(x, p, dtype)
    assert_same(got, want, f"{method}{kw} {shape} {dtype} encode")
    assert_same(kernels.decode(want, p, dtype), ops.decode(want, p, dtype), f"{method}{kw} {shape} {dtype} decode")


@pytest.mark.parametrize("method,kw", METHOD_BITS, ids=[f"{m}-{'-'.join(map(str, k.values()))}" for m, k in METHOD_BITS])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_bits_and_dtypes(method, kw, dtype):
    _check(method, kw, (2, 3, 5, 128), dtype)


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("method,kw", [("turboquant", dict(bits=3)), ("turboquant_rvq", dict(bits=2, bits2=3)),
                                       ("rabitq", dict()), ("turboquant_prod", dict(bits=4))])
def test_head_dims(method, kw, d):
    _check(method, kw, (1, 2, 4, d), "bfloat16", seed=d)


@pytest.mark.parametrize("method", ["turboquant", "turboquant_rvq", "rabitq", "turboquant_prod"])
def test_window_and_many_tokens(method):
    _check(method, {}, (1, 4, 300, 64), "float16", window=37)
    _check(method, {}, (2, 2, 9, 32), "float32", window=20)   # everything in the window: Q = 0


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


@pytest.mark.parametrize("method", ["turboquant", "turboquant_prod", "kivi"])
def test_stream_through_kernels(method):
    """Chunked appends through kernels store the bytes of accelerated.ops's stream and of one-shot encode."""
    rng = np.random.default_rng(9)
    p = spec.Params(method, window=5)
    x = _x(rng, (1, 2, 70, 64), "bfloat16")
    a, b = Stream(p, use_kernels=True), Stream(p, use_kernels=False)
    for lo, hi in [(0, 1), (1, 40), (40, 41), (41, 70)]:
        a.append(x[:, :, lo:hi])
        b.append(x[:, :, lo:hi])
    assert_same(a.record(), b.record(), f"{method} stream")
    assert_same(a.record(), ops.encode(x, p), f"{method} stream vs one-shot")
    assert_same(a.dequantized(), b.dequantized(), f"{method} stream dequantized")
