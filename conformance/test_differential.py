"""Differential tier: the implementation against the numpy reference, bit for bit, on random inputs.

Hypothesis draws shapes (B, H, T, d over every head dim), seeds, layers, head offsets, windows, roles,
group sizes, value regimes (huge, tiny, subnormal, zeros, raw bit patterns, half-integer grids that tie
KIVI's rint) and chunkings. Each test is one (method, bits, dtype) cell of the report table.
"""
from __future__ import annotations

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


WIDE_SHAPES = [(4, 8, 3, 32), (4, 9, 2, 64), (5, 8, 2, 96)]   # B >= 4, H >= 8 (every head gets its own signs)


def test_wide_shapes(other, ref, methods_ok, tally, method, bits, dtype):
    """More batch rows and heads than the drawn shapes give: B >= 4, H >= 8, encode/decode and a chunked
    stream, at head offsets near 2^32 and at 0."""
    methods_ok(method)
    import numpy as np

    from .. import spec
    from . import data as _data
    info = spec.method_info(method)
    for i, (b, h, t, d) in enumerate(WIDE_SHAPES):
        kw = {"bits2": bits} if method == "turboquant_rvq" else {}
        if method == "kivi":
            kw.update(group_size=16, role="kv"[i % 2])
            t += 16
        elif "group_sizes" in info:
            kw.update(group_size=32)
        p = spec.Params(method, bits=bits, window=1, seed=2 ** 64 - 1 - i, layer=i,
                        head_offset=(0, 2 ** 32 - 9, 5)[i], **kw).resolved()
        x = _data.make_x(np.random.default_rng(i), (b, h, t, d), dtype, "normal")
        tally.case(2)
        checks.check_encode_decode(other, ref, x, p, dtype)
        checks.check_stream_matches_oneshot(other, ref, x, p, dtype, [1, t - 1])


def _encodable(ref, x, p, dtype) -> bool:
    try:
        ref.encode(x, p, dtype)
        return True
    except ValueError:
        return False
