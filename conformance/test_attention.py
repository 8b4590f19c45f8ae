"""Tolerance tier (spec/README.md "Tiers"): softmax attention over the decoded cache against a float64
evaluation of the same formula on the same decoded K, V. Budgets: checks.ATTN_SAFETY and
checks.attention_budget (named terms with their reasons)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import spec

from . import checks, data
from .conftest import selected_methods


def pytest_generate_tests(metafunc):
    if {"method", "dtype"} <= set(metafunc.fixturenames):
        cells = [(m, dt) for m in selected_methods(metafunc.config) for dt in spec.DTYPES]
        metafunc.parametrize("method,dtype", cells, ids=[f"{m}-{dt}" for m, dt in cells])


def _p(method, role):
    kw = dict(group_size=32) if method in ("kivi", "mlx_affine") else {}
    return spec.Params(method, window=4, role=role, **kw).resolved()


@given(data_=st.data())
def test_attention(impl, ref, methods_ok, tally, method, dtype, data_, record_property):
    methods_ok(method)
    kp, vp = _p(method, "k"), _p(method, "v")
    record_property("bits", kp.bits)
    d = data_.draw(st.sampled_from([32, 64, 128]), label="d")
    t = data_.draw(st.integers(1, 80), label="T")
    h, rep, tq = data_.draw(st.sampled_from([(1, 1, 1), (2, 2, 1), (2, 1, 5)]), label="H, GQA, Tq")
    seed = data_.draw(st.integers(0, 2 ** 32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    k = data.make_x(rng, (1, h, t, d), dtype, "normal")
    v = data.make_x(rng, (1, h, t, d), dtype, "normal")
    q = (rng.standard_normal((1, h * rep, tq, d)) * data_.draw(st.sampled_from([0.5, 1.0, 4.0]))).astype(np.float32)
    scale = float(np.float32(1.0 / np.sqrt(d)))
    tally.case()
    checks.check_attention(impl, ref, q, ref.encode(k, kp, dtype), ref.encode(v, vp, dtype), kp, vp, dtype, scale)
