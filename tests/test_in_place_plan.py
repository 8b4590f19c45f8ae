"""accelerated.in_place.InPlace: the decode step's remembered append checks. A remembered plan must be used only
while it still describes the streams (same stream objects at the versions it left, same chunk shape and
dtype, room in the buffers); any other change of a stream (restore after a rejected chunk, trim, a general
append that grows the buffers) must make the next append check again and pass the streams' current buffers
and row. The launch itself is recorded here (its bytes are tests/test_append_kernel_emulated.py's); the first
append runs in the CPU emulator of the kernels (tests/_kernel_emulator.py)."""
from __future__ import annotations

import copy
import shutil

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import in_place as ip, stream as st
from veloxquant.accelerated.kernels import append as fused

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")


@pytest.fixture(scope="module")
def lib():
    import _kernel_emulator as ke
    return ke.build()


@pytest.fixture
def launches(lib, monkeypatch, tune):
    import _kernel_emulator as ke
    ke.install(monkeypatch, tune, lib)
    calls = []

    def record(kp, keys, kbufs, vp, values, vbufs, base, after):
        calls.append(dict(kbufs=kbufs, vbufs=vbufs, base=base))
        return mx.zeros((2, 1, 2), dtype=mx.bool_)
    monkeypatch.setattr(fused, "append", record)
    return calls


def _x(t: int, seed: int) -> mx.array:
    return mx.array(np.random.default_rng(seed).standard_normal((1, 2, t, 32)).astype(np.float16))


def _pair(t0: int = 3):
    k = st.Stream(spec.Params("turboquant", bits=4, role="k"), use_kernels=True)
    v = st.Stream(spec.Params("turboquant", bits=4, role="v"), use_kernels=True)
    k.append(_x(t0, 1))
    v.append(_x(t0, 2))
    return k, v


def _current(s: st.Stream) -> dict:
    return {n: r.buf for n, r in s._rows.items()}


def _same_bufs(got: dict, s: st.Stream) -> bool:
    return got.keys() == _current(s).keys() and all(got[n] is r.buf for n, r in s._rows.items())


def test_plan_is_reused_between_decode_steps(launches):
    k, v = _pair()
    tok, plan = ip.append_in_place(k, v, _x(1, 3), _x(1, 4), None)
    assert tok is not None and plan is not None
    for i in range(5):
        tok, again = ip.append_in_place(k, v, _x(1, 5 + i), _x(1, 6 + i), tok, plan)
        assert again is plan, f"step {i}: append_in_place rebuilt a plan that still holds"
    assert [c["base"] for c in launches] == [3, 4, 5, 6, 7, 8], [c["base"] for c in launches]
    assert k.tokens == v.tokens == 9 and all(_same_bufs(c["kbufs"], k) for c in launches)


def test_restore_makes_it_check_again(launches):
    k, v = _pair()
    tok, plan = ip.append_in_place(k, v, _x(1, 3), _x(1, 4), None)
    mk, mv = k.mark(), v.mark()
    tok, plan = ip.append_in_place(k, v, _x(1, 5), _x(1, 6), tok, plan)
    k.restore(mk)          # a rejected chunk rolled back (cache/base.py)
    v.restore(mv)
    tok, plan2 = ip.append_in_place(k, v, _x(1, 7), _x(1, 8), tok, plan)
    assert plan2 is not plan, "a plan taken before a restore was reused"
    assert [c["base"] for c in launches] == [3, 4, 4], [c["base"] for c in launches]


def test_no_room_or_new_buffers(launches):
    k, v = _pair()
    room = min(r.buf.shape[2] - r.n for s in (k, v) for r in s._rows.values())
    tok, plan = ip.append_in_place(k, v, _x(1, 3), _x(1, 4), None)
    for i in range(room - 1):
        tok, plan = ip.append_in_place(k, v, _x(1, 9), _x(1, 9), tok, plan)
    assert plan is not None and plan.room == 0
    assert ip.append_in_place(k, v, _x(1, 5), _x(1, 6), tok, plan) == (None, None), "wrote past the buffers"
    k.sync()
    k.append(_x(1, 7))             # the general path grows the buffers (new arrays)
    v.append(_x(1, 8))
    tok, plan2 = ip.append_in_place(k, v, _x(1, 9), _x(1, 9), tok, plan)
    assert plan2 is not plan and _same_bufs(launches[-1]["kbufs"], k) and _same_bufs(launches[-1]["vbufs"], v)


def test_other_chunk_shape_or_streams(launches):
    k, v = _pair()
    tok, plan = ip.append_in_place(k, v, _x(1, 3), _x(1, 4), None)
    tok, plan2 = ip.append_in_place(k, v, _x(2, 5), _x(2, 6), tok, plan)
    assert plan2 is not plan and launches[-1]["base"] == 4
    k2, v2 = _pair()
    tok, plan3 = ip.append_in_place(k2, v2, _x(2, 5), _x(2, 6), None, plan2)
    assert plan3 is not plan2 and _same_bufs(launches[-1]["kbufs"], k2)


def test_copy_has_no_plan():
    assert copy.deepcopy(ip.InPlace()) is None


def _filled(s: st.Stream) -> np.ndarray:
    """The stream's window buffer with every element distinct (written in place): a view of other rows shows."""
    mx.eval(s._wbuf)
    a = np.array(memoryview(s._wbuf), copy=False)
    a[...] = (np.arange(a.size) % 2039).reshape(a.shape)
    return a


def _windowed(lib, monkeypatch, tune, kp: dict, vp: dict):
    """A stream pair with exact windows after one in-place append (the launch stubbed: no bytes written) and its plan."""
    import _kernel_emulator as ke
    ke.install(monkeypatch, tune, lib)
    monkeypatch.setattr(fused, "append", lambda *a, **kw: mx.zeros((2, 1, 2), dtype=mx.bool_))
    k = st.Stream(spec.Params(role="k", **kp), use_kernels=True)
    v = st.Stream(spec.Params(role="v", **vp), use_kernels=True)
    k.append(_x(40, 1))         # (KIVI: encoded groups, a window of R .. R + G - 1 tokens)
    v.append(_x(40, 2))
    tok, plan = ip.append_in_place(k, v, _x(1, 3), _x(1, 4), None)
    assert plan is not None and plan.win
    return k, v, tok, plan


@pytest.mark.parametrize("kp,vp", [
    (dict(method="turboquant", bits=4, window=4), dict(method="turboquant", bits=4, window=4)),
    (dict(method="kivi", bits=2, group_size=16, window=16), dict(method="kivi", bits=2, group_size=16, window=16)),
    (dict(method="kivi", bits=2, group_size=16, window=0), dict(method="kivi", bits=2, group_size=16, window=0)),
    (dict(method="turboquant", bits=3), dict(method="kivi", bits=2, group_size=16, window=16))])
def test_window_views_are_the_buffer_rows(lib, monkeypatch, tune, kp, vp):
    """InPlace.windows' views (mx.as_strided over Stream._wflat) are the rows a slice of Stream._wbuf takes, step
    after step through KIVI's flushes; a plan whose window buffer was replaced refuses to make them."""
    k, v, tok, plan = _windowed(lib, monkeypatch, tune, kp, vp)
    bufs = {id(s): _filled(s) for s in (k, v) if s._wbuf is not None}
    for step in range(40):
        got = list(plan.windows())
        held = plan.held
        t, fs, owns = plan.t, plan.flushes(), plan.owns()
        for i, s in enumerate((k, v)):
            if not plan.wins[i]:
                assert held[i] is None
                continue
            a, ws, r, f, own = bufs[id(s)], s._ws, s._window.shape[2], fs[i], owns[i]
            want = (a[:, :, ws:ws + (f or t)], a[:, :, ws + f - own:ws + r + t], a[:, :, ws + f:ws + r + t])
            for name, g, w in zip(("kf", "kw", "held"), (got.pop(0), got.pop(0), held[i]), want):
                # (KIVI's kf where nothing leaves: any t rows, never read, so one view for every such step)
                rows = name != "kf" or f or not plan.groups[i]
                assert g.shape == w.shape and (not rows or np.array_equal(np.array(g), w)), \
                    f"step {step} role {i}: {name}"
        assert not got
        tok, again = ip.append_in_place(k, v, _x(1, 5 + step), _x(1, 6 + step), tok, plan)
        if again is not plan:
            break
    s = k if plan.wins[0] else v
    s._wflat = s._wbuf.reshape(-1)       # (a buffer the plan did not make)
    with pytest.raises(ValueError, match="window buffer"):
        plan.windows()


def test_fits_asks_what_a_kivi_step_encodes(lib, monkeypatch, tune):
    """KIVI's steps encode nothing or a group of G: records with room for fewer than G tokens take the steps that
    flush none and refuse a flushing one; window buffers with room for fewer than t tokens refuse any step."""
    kivi = dict(method="kivi", bits=2, group_size=16, window=16)
    k, v, tok, plan = _windowed(lib, monkeypatch, tune, kivi, kivi)
    seen = set()
    for step in range(20):
        rooms, wroom, f = list(plan.rooms), list(plan.wroom), plan.flushes()
        seen.add(f)
        for room in (0, 1, 15, 16):
            for role in (0, 1):     # (the other role with room to spare)
                plan.rooms = [room if i == role else 1000 for i in (0, 1)]
                assert plan._fits() == (room >= f[role]), f"step {step}: flushes {f}, role {role} room {room}"
        plan.rooms = rooms
        for role in (0, 1):
            plan.wroom = [0 if i == role else w for i, w in enumerate(wroom)]
            assert not plan._fits(), f"step {step}: no room in role {role}'s window buffer"
        plan.wroom = wroom
        tok, plan = ip.append_in_place(k, v, _x(1, 5 + step), _x(1, 6 + step), tok, plan)
    assert seen == {(0, 0), (16, 16)}, seen
