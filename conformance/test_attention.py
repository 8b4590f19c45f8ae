"""Tolerance tier (spec/README.md "Tiers", spec/attention.md): softmax attention over the cache against a
float64 evaluation of the same formula on the same decoded K, V. Budgets: attention_checks.ATTN_SAFETY,
attention_checks.ROTATED_DOMAIN terms and attention_checks.attention_budget (named terms with their reasons).

Drawn: head dims, lengths up to 700 (several blocks / splits of an online softmax), GQA layouts (KV heads
1-4, 1-4 query heads each), query blocks of 1-8 rows with and without the causal mask, windows, query
scales up to sharp softmaxes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from .. import spec

from . import attention_checks, data
from .conftest import selected_methods


def pytest_generate_tests(metafunc):
    if {"method", "dtype"} <= set(metafunc.fixturenames):
        cells = [(m, dt) for m in selected_methods(metafunc.config) for dt in spec.DTYPES]
        metafunc.parametrize("method,dtype", cells, ids=[f"{m}-{dt}" for m, dt in cells])


def _p(method, role, window):
    kw = dict(group_size=32) if method in ("kivi", "mlx_affine") else {}
    return spec.Params(method, window=window, role=role, **kw).resolved()


@given(data_=st.data())
def test_attention(impl, ref, methods_ok, tally, method, dtype, data_, record_property):
    methods_ok(method)
    window = data_.draw(st.sampled_from([0, 4, 40]), label="window")
    kp, vp = _p(method, "k", window), _p(method, "v", window)
    record_property("bits", kp.bits)
    d = data_.draw(st.sampled_from([32, 64, 96, 128]), label="d")
    t = data_.draw(st.one_of(st.integers(1, 80), st.integers(250, 700)), label="T")
    h = data_.draw(st.integers(1, 4), label="KV heads")
    rep = data_.draw(st.integers(1, 4), label="query heads per KV head")
    tq = data_.draw(st.sampled_from([1, 1, 2, 5, 8]), label="Tq")
    mask = data_.draw(st.sampled_from([None, "causal"]), label="mask") if tq <= t else None
    seed = data_.draw(st.integers(0, 2 ** 32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    k = data.make_x(rng, (1, h, t, d), dtype, "normal")
    v = data.make_x(rng, (1, h, t, d), dtype, "normal")
    q = (rng.standard_normal((1, h * rep, tq, d)) * data_.draw(st.sampled_from([0.5, 1.0, 4.0]))).astype(np.float32)
    scale = float(np.float32(1.0 / np.sqrt(d)))
    tally.case()
    attention_checks.check_attention(impl, ref, q, ref.encode(k, kp, dtype), ref.encode(v, vp, dtype), kp, vp,
                                     dtype, scale, mask)


@pytest.mark.method("turboquant")
@pytest.mark.parametrize("rep", [2, 3])
def test_attention_gqa_head_mapping(impl, ref, methods_ok, rep):
    """Second, independent check of the GQA mapping (attention_checks.check_attention_head_mapping)."""
    methods_ok("turboquant")
    attention_checks.check_attention_head_mapping(impl, ref, "turboquant", rep)
