"""Benchmarks: accelerated (MLX ops) vs the numpy reference (a black box), encode and decode, every method,
on CPU at B=1, H=8, T=256, d=128, float16 input.

Run:  pytest benchmarks --benchmark-only           (add --benchmark-group-by=group to compare per method)
Not part of the default `pytest` run (pyproject testpaths are tests/ and conformance/).
The MLX timings include mx.eval (MLX is lazy) and the host round trip of the finiteness check.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import ops

B, H, T, D = 1, 8, 256, 128
DTYPE = "float16"
METHODS = [
    ("turboquant", dict(bits=4)), ("turboquant_rvq", dict(bits=2, bits2=2)), ("turboquant_prod", dict(bits=4)),
    ("kivi", dict(bits=2, group_size=32, window=0)), ("rabitq", dict()), ("mlx_affine", dict(bits=4, group_size=64)),
]


@pytest.fixture(scope="module", autouse=True)
def _cpu():
    mx.set_default_device(mx.cpu)


def _x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((B, H, T, D)).astype(np.float16)


def _reference(method):
    reference = pytest.importorskip("veloxquant.reference")
    try:
        reference.method_module(spec.Params(method))
    except ValueError as e:
        pytest.skip(f"reference: {e}")
    return reference


@pytest.mark.parametrize("op", ["encode", "decode"])
@pytest.mark.parametrize("impl", ["mlx_ops", "reference"])
@pytest.mark.parametrize("method,kw", METHODS, ids=[m for m, _ in METHODS])
def test_bench(benchmark, method, kw, impl, op):
    p = spec.Params(method, **kw).resolved()
    x = _x()
    benchmark.group = f"{method}-{op}"
    if impl == "reference":
        reference = _reference(method)
        if op == "encode":
            benchmark(reference.encode, x, p, DTYPE)
        else:
            rec = reference.encode(x, p, DTYPE)
            benchmark(reference.decode, rec, p, DTYPE)
        return
    xm = mx.array(x)
    if op == "encode":
        benchmark(lambda: mx.eval(*ops.encode(xm, p).values()))
    else:
        rec = ops.encode(xm, p)
        mx.eval(*rec.values())
        benchmark(lambda: mx.eval(ops.decode(rec, p)))
