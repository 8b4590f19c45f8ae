"""Differential tier: the implementation against the numpy reference, bit for bit, on random inputs.

Hypothesis draws shapes (B, H, T, d over every head dim), seeds, layers, head offsets, windows, roles,
group sizes, value regimes (huge, tiny, subnormal, zeros, raw bit patterns, half-integer grids that tie
KIVI's rint) and chunkings. Each test is one (method, bits, dtype) cell of the report table.
"""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from . import checks, strategies
from .conftest import selected_methods


def pytest_generate_tests(metafunc):
    names = [n for n in ("method", "bits", "dtype") if n in metafunc.fixturenames]
    if names == ["method", "bits", "dtype"]:
        cells = strategies.method_bits_dtype(selected_methods(metafunc.config))
        metafunc.parametrize("method,bits,dtype", cells, ids=[f"{m}-b{b}-{dt}" for m, b, dt in cells])


@given(data=st.data())
def test_encode_decode(other, ref, methods_ok, tally, method, bits, dtype, data):
    """encode bit-exact (or the same rejection), and decode of the reference record bit-exact."""
    methods_ok(method)
    p, shape = data.draw(strategies.params_and_shape(method, bits), label="params, shape")
    x = data.draw(strategies.inputs(shape, dtype), label="x")
    tally.case()
    checks.check_encode_decode(other, ref, x, p, dtype)


@given(data=st.data())
def test_stream_chunking(other, ref, methods_ok, tally, method, bits, dtype, data):
    """Any chunking of the appends stores the bytes of the reference's one-shot encode."""
    methods_ok(method)
    p, shape = data.draw(strategies.params_and_shape(method, bits, max_t=12), label="params, shape")
    x = data.draw(strategies.inputs(shape, dtype).filter(
        lambda a: _encodable(ref, a, p, dtype)), label="x")
    chunks = data.draw(strategies.chunking(shape[2]), label="chunks")
    tally.case()
    checks.check_stream_matches_oneshot(other, ref, x, p, dtype, chunks)


def _encodable(ref, x, p, dtype) -> bool:
    try:
        ref.encode(x, p, dtype)
        return True
    except ValueError:
        return False
