"""Differential test: accelerated (MLX ops) against the numpy reference, as black boxes, bit for bit.

Only this test imports `reference` (accelerated never does). Skipped until the reference is importable.
Interchange as in docs/interfaces.md: bfloat16 travels as uint16 bit patterns.
"""
from __future__ import annotations

import zlib

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import ops
from veloxquant.accelerated.stream import Stream

reference = pytest.importorskip("veloxquant.reference")
import veloxquant.reference.stream
from veloxquant import reference  # noqa: E402  (a submodule; the package may not import it)

CASES = [
    ("turboquant", dict(bits=1)), ("turboquant", dict(bits=3, window=3)), ("turboquant", dict(bits=4)),
    ("turboquant_rvq", dict(bits=2, bits2=3)), ("turboquant_rvq", dict(bits=4, bits2=1, window=2)),
    ("turboquant_prod", dict(bits=2)), ("turboquant_prod", dict(bits=5, window=1)),
    ("rabitq", dict(window=2)),
    ("kivi", dict(bits=2, group_size=16, role="k", window=5)), ("kivi", dict(bits=3, group_size=32, role="v")),
    ("kivi", dict(bits=8, group_size=16, role="v", window=0)),
    ("mlx_affine", dict(bits=4, group_size=32)), ("mlx_affine", dict(bits=2, group_size=64, window=2)),
]
DTYPES = ["float16", "bfloat16", "float32"]


def _input(rng, shape, dtype) -> np.ndarray:
    """Numpy interchange input: mixed scales, exact zeros, a zero token, ties for KIVI."""
    x = rng.standard_normal(shape).astype(np.float32) * np.exp(rng.uniform(-4, 4, shape[:-1] + (1,)))
    x[..., 0, :] = 0.0
    x[..., 1, ::3] = -0.0
    x = x.astype(np.float32)
    if dtype == "float16":
        return x.astype(np.float16)
    if dtype == "bfloat16":  # RNE to bf16 bit patterns
        u = x.view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return x


def _to_mx(a: np.ndarray, dtype: str) -> mx.array:
    return mx.array(a).view(mx.bfloat16) if (dtype == "bfloat16" and a.dtype == np.uint16) else mx.array(a)


def _to_np(a: mx.array) -> np.ndarray:
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)


def _skip_unless_reference_has(method):
    try:
        reference.method_module(spec.Params(method))
    except ValueError as e:
        pytest.skip(f"reference: {e}")


def _assert_bits(name, got: np.ndarray, want: np.ndarray):
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape, want.dtype, want.shape)
    if got.dtype.itemsize in (2, 4):
        u = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
        diff = got.view(u) ^ want.view(u)
        bad = np.flatnonzero(diff)
        assert bad.size == 0, f"{name}: {bad.size} values differ, first at {bad[:5]}, XOR {diff.flat[bad[:5]]}"
    else:
        assert np.array_equal(got, want), name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method,kw", CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CASES)])
def test_encode_decode_match_reference(method, kw, dtype):
    rng = np.random.default_rng(zlib.crc32(f"{method}{kw}{dtype}".encode()))
    _skip_unless_reference_has(method)
    p = spec.Params(method, seed=0xDEADBEEF12345678, layer=3, head_offset=5, **kw).resolved()
    x = _input(rng, (2, 3, 37, 64), dtype)
    want = reference.encode(x, p, dtype)
    got = {k: _to_np(v) for k, v in ops.encode(_to_mx(x, dtype), p).items()}
    assert list(got) == list(want)
    for k in want:
        _assert_bits(k, got[k], np.asarray(want[k]))
    dec_want = reference.decode(want, p, dtype)
    dec_got = _to_np(ops.decode({k: _to_mx(v, dtype) for k, v in want.items()}, p))
    _assert_bits("decoded", dec_got, np.asarray(dec_want, dtype=np.float32))


@pytest.mark.parametrize("method,kw", CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CASES)])
def test_stream_with_trim_matches_reference(method, kw):
    """The same operation history (appends and trims, KIVI's lossy re-window included) stores the same bytes."""
    _skip_unless_reference_has(method)
    dtype = "bfloat16"
    rng = np.random.default_rng(7)
    p = spec.Params(method, **kw).resolved()
    x = _input(rng, (1, 2, 90, 32 if method != "mlx_affine" else 64), dtype)
    ref = reference.stream.Stream(p, dtype)
    acc = Stream(p, dtype)
    i = 0
    for step, n in enumerate([7, 1, 30, 5, 2, 25, 20]):
        ref.append(x[:, :, i:i + n])
        acc.append(_to_mx(x[:, :, i:i + n], dtype))
        i += n
        if step in (2, 5):
            assert acc.trim(9 + step) == ref.trim(9 + step)
        want, got = ref.record(), acc.record()
        assert list(got) == list(want) and acc.tokens == ref.tokens
        for k in want:
            _assert_bits(f"step {step} {k}", _to_np(got[k]), np.asarray(want[k]))
