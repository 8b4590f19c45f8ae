"""Exact trims (spec/streaming.md "Exact trims", spec 1.1): with `exact_trim` E, appending tokens and trimming
up to E of them leaves the one-shot encode of the survivors (the speculative-decoding pattern), and any
history of appends, trims and save/load equals the reference replaying it (kept tokens included)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from .. import spec

from . import checks, data
from .conftest import selected_methods
from .test_cache_sequences import _ops


def _params(method, window, exact_trim, role="k"):
    kw = {"kivi": dict(group_size=16), "mlx_affine": dict(group_size=32)}.get(method, {})
    return spec.Params(method, window=window, exact_trim=exact_trim, seed=5, layer=1, head_offset=3, role=role,
                       **kw).resolved()


def pytest_generate_tests(metafunc):
    if {"method", "dtype"} <= set(metafunc.fixturenames):
        cells = [(m, dt) for m in selected_methods(metafunc.config) for dt in spec.DTYPES]
        metafunc.parametrize("method,dtype", cells, ids=[f"{m}-{dt}" for m, dt in cells])


@st.composite
def _cycles(draw, e, dtype, d):
    """A prefill, then cycles of (chunk of a tokens, n <= min(E, a) of them trimmed)."""
    pre = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    prefill = data.make_x(rng, (1, 2, pre, d), dtype, "normal")
    cycles = []
    for _ in range(draw(st.integers(1, 12))):
        a = draw(st.integers(1, e + 2))
        n = draw(st.integers(0, min(e, a)))
        cycles.append((data.make_x(rng, (1, 2, a, d), dtype, "normal"), n))
    return prefill, cycles


@pytest.mark.parametrize("window,exact_trim", [(3, 4), (20, 5), (0, 3)])
@given(data_=st.data())
def test_trim_after_appends_is_exact(impl, ref, methods_ok, tally, method, dtype, window, exact_trim, data_,
                                     record_property):
    """Append a draft, trim up to E of it, repeat: after each cycle the bytes of a one-shot encode."""
    methods_ok(method)
    role = data_.draw(st.sampled_from("kv"), label="role")
    p = _params(method, window, exact_trim, role)
    record_property("bits", p.bits)
    prefill, cycles = data_.draw(_cycles(exact_trim, dtype, 32), label="cycles")
    tally.case()
    checks.check_exact_trims(impl, ref, prefill, cycles, p, dtype)


@given(data_=st.data())
def test_histories_with_kept_tokens(impl, ref, methods_ok, tally, method, dtype, data_, record_property):
    """Random appends/trims/save-load with E > 0: equal to the reference replaying the same ops after every
    op (trims deeper than E, kivi's decoded fallback and save/load of the kept tokens included)."""
    methods_ok(method)
    if impl.name == "reference":
        pytest.skip("the reference is what the replay compares against")
    e = data_.draw(st.sampled_from([2, 7, 20]), label="exact_trim")
    p = _params(method, data_.draw(st.sampled_from([0, 3]), label="window"), e)
    record_property("bits", p.bits)
    ops = data_.draw(_ops((1, 2, 0, 32), dtype), label="ops")
    tally.case()
    checks.check_stream_replay(impl, ref, p, dtype, ops)
