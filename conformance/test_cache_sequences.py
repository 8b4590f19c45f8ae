"""Cache sequences (spec/streaming.md): prefill, many single-token decodes, trims, save/load.

Stored bytes must equal the reference's one-shot encode of the tokens where the spec says the state is a
function of the tokens (any chunking; per-token methods with R = 0 after trims), and the reference
replaying the same operations otherwise (windows after trims, KIVI's lossy trim)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from .. import spec

from . import checks, data, strategies
from .assertions import Mismatch, assert_record_exact, call_desc
from .conftest import selected_methods


def _params(method, window):
    kw = {}
    if method == "kivi":
        kw = dict(group_size=16)
    if method == "mlx_affine":
        kw = dict(group_size=32)    # <= every head dim drawn below
    return spec.Params(method, window=window, seed=7, layer=3, head_offset=2, **kw).resolved()


def pytest_generate_tests(metafunc):
    if {"method", "dtype"} <= set(metafunc.fixturenames):
        cells = [(m, dt) for m in selected_methods(metafunc.config) for dt in spec.DTYPES]
        metafunc.parametrize("method,dtype", cells, ids=[f"{m}-{dt}" for m, dt in cells])


@pytest.mark.parametrize("window", [0, 5])
def test_prefill_then_decode(impl, ref, methods_ok, tally, method, dtype, window, record_property):
    """Prefill 37 tokens, then 40 single-token appends: the bytes of a one-shot encode of all 77."""
    methods_ok(method)
    p = _params(method, window)
    record_property("bits", p.bits)
    x = data.make_x(np.random.default_rng(11), (1, 2, 77, 64), dtype, "normal")
    tally.case()
    checks.check_stream_matches_oneshot(impl, ref, x, p, dtype, [37] + [1] * 40)


@st.composite
def _ops(draw, shape, dtype):
    """A random op history: appends of random sizes (often single tokens), trims, save/load."""
    b, h, _t, d = shape
    ops, t = [], 0
    for i in range(draw(st.integers(1, 10))):
        # the first op appends (B, H, d are only known then); later ops are any mix
        kind = "append" if i == 0 else draw(st.sampled_from(["append", "append", "append1", "trim", "save_load"]))
        if kind.startswith("append"):
            n = 1 if kind == "append1" else draw(st.integers(1, 40))
            seed = draw(st.integers(0, 2 ** 32 - 1))
            ops.append(("append", data.make_x(np.random.default_rng(seed), (b, h, n, d), dtype, "normal")))
            t += n
        elif kind == "trim":
            n = draw(st.integers(0, t + 2))
            ops.append(("trim", n))
            t -= min(n, t)
        else:
            ops.append(("save_load",))
    return ops


def _surviving(ops):
    """The token sequence after the ops (what one-shot encode must match for per-token R = 0)."""
    xs = None
    for op in ops:
        if op[0] == "append":
            xs = op[1] if xs is None else np.concatenate([xs, op[1]], axis=2)
        elif op[0] == "trim" and xs is not None:
            xs = xs[:, :, :xs.shape[2] - min(op[1], xs.shape[2])]
    return xs


@pytest.mark.parametrize("window", [0, 3])
@given(data_=st.data())
def test_random_histories(impl, ref, methods_ok, tally, method, dtype, window, data_, record_property):
    """Random appends/trims/save-load: equal to the reference replaying the same ops after every op;
    where the spec makes the state a function of the tokens, equal to a one-shot encode of them."""
    methods_ok(method)
    p = _params(method, window)
    record_property("bits", p.bits)
    # powers of two and the non-powers of two of real models (spec 1.1); mlx_affine's G = 32 must divide d
    d = data_.draw(st.sampled_from([d for d in (32, 64, 128, 96, 80) if method != "mlx_affine" or d % 32 == 0]),
                   label="d")
    ops = data_.draw(_ops((1, 2, 0, d), dtype), label="ops")
    tally.case()
    if impl.name != "reference":
        checks.check_stream_replay(impl, ref, p, dtype, ops)
    had_trim = any(op[0] == "trim" and op[1] > 0 for op in ops)
    per_token = spec.method_info(method)["per_token"]
    xs = _surviving(ops)
    if xs is None or xs.shape[2] == 0:
        return
    if not had_trim or (per_token and window == 0):
        final = checks.replay(impl, p, dtype, ops)[-1]
        what = call_desc(f"{impl.name}.Stream", p, dtype, ops=" ".join(checks.op_desc(o) for o in ops))
        assert_record_exact(final[1], ref.encode(xs, p, dtype), what + " vs one-shot encode of the tokens")


@given(data_=st.data())
def test_save_load_continues(impl, methods_ok, tally, method, dtype, data_, record_property):
    """Continuing after save/load is identical to continuing without it (the implementation alone)."""
    methods_ok(method)
    p = _params(method, 3)
    record_property("bits", p.bits)
    ops = data_.draw(_ops((1, 2, 0, 32), dtype), label="ops")
    plain = [o for o in ops if o[0] != "save_load"]
    tally.case()
    got = checks.replay(impl, p, dtype, ops)[-1]
    exp = checks.replay(impl, p, dtype, plain)[-1]
    what = call_desc(f"{impl.name}.Stream", p, dtype, ops=" ".join(checks.op_desc(o) for o in ops))
    if got[0] != exp[0]:
        raise Mismatch(f"{what}: tokens {got[0]} != {exp[0]} without save/load")
    assert_record_exact(got[1], exp[1], what + " vs the same ops without save/load")


# Chunks that cross the 256- and 512-row steps a cache's buffer typically grows by (mlx-lm's KVCache
# step is 256): T = 600 reaches the third step, and no chunk edge falls on a step edge.
LONG_CHUNKS = [200, 100, 1, 254, 3, 42]          # cumulative 200, 300, 301, 555, 558, 600


@pytest.mark.parametrize("window", [0, 5])
def test_long_stream_crosses_buffer_steps(impl, ref, methods_ok, tally, method, dtype, window, record_property):
    """T > 256 and > 512 with chunks crossing the 256-row boundaries: one-shot bytes; then trims back across
    the boundaries and appends again: the reference replaying the same ops."""
    methods_ok(method)
    p = _params(method, window)
    record_property("bits", p.bits)
    x = data.make_x(np.random.default_rng(600), (1, 2, sum(LONG_CHUNKS), 32), dtype, "normal")
    tally.case()
    checks.check_stream_matches_oneshot(impl, ref, x, p, dtype, LONG_CHUNKS)
    if impl.name == "reference":
        return
    more = data.make_x(np.random.default_rng(601), (1, 2, 300, 32), dtype, "normal")
    ops = [("append", x[:, :, :300]), ("append", x[:, :, 300:]), ("trim", 90), ("append", more[:, :, :3]),
           ("trim", 260), ("append", more[:, :, 3:])]     # 600 -> 510 -> 513 -> 253 -> 550 tokens
    tally.case()
    checks.check_stream_replay(impl, ref, p, dtype, ops)


@pytest.mark.method("kivi")
@pytest.mark.parametrize("role", ["k", "v"])
@pytest.mark.parametrize("kdtype", spec.DTYPES)
def test_kivi_trim_puts_back_decoded(impl, methods_ok, tally, kdtype, role, record_property):
    """Second check of kivi's lossy trim (streaming.md 'Trim' step 2), without the reference: the tokens a
    trim cuts out of an encoded group come back as the implementation's own decoded values."""
    methods_ok("kivi")
    dtype = kdtype
    for k, v in (("method", "kivi"), ("dtype", dtype)):
        record_property(k, v)
    p = spec.Params("kivi", window=5, group_size=16, role=role, seed=3).resolved()
    record_property("bits", p.bits)
    x = data.make_x(np.random.default_rng(40), (1, 2, 40, 32), dtype, "normal")   # Q = 32, window 8
    for n in (12, 20, 9):      # T' = 28 (Q' = 16), 20 (Q' = 16), 31 (Q' = 16)
        tally.case()
        checks.check_kivi_trim_put_back(impl, p, dtype, x, n)
