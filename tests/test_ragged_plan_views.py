"""The ragged in-place plans' window views (cache/ragged_step.py: mx.as_strided over the window buffer flattened once,
RaggedStream._wflat), host only: step after step (the launch left out: `stored` with no token, so the buffer keeps the
distinct values written into it) each plan's views hold the buffer rows a slice of RaggedStream._wbuf takes, through
each phase's flushes: a KIVI role's (kf, kw) from x (where rows flush) and the rows' least boundaries, a windowed
per-token role's oldest row and its window; a plan whose buffer was replaced, or whose steps ran past its buffer's
room, refuses to make them (ValueError) rather than read other memory."""
from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated.cache import ragged_step
from _batch_util import filled_with, kv

G = 16


def _maker(km: str, vm: str, kwin: int, vwin: int):
    def make():
        c = vc.VeloxKVCache(key_method=km, key_bits=2 if km == "kivi" else 3, value_method=vm,
                            value_bits=2 if vm == "kivi" else 3, group_size=G, seed=2, layer=1, window=max(kwin, vwin))
        c.key_params = dataclasses.replace(c.key_params, window=kwin)
        c.value_params = dataclasses.replace(c.value_params, window=vwin)
        return c
    return make


CASES = {   # (keys' method, values' method, keys' R, values' R): the plan RaggedInPlace.check gives
    "kivi-pair": ("kivi", "kivi", 16, 16, ragged_step.RaggedInPlace),
    "kivi-pair-R0": ("kivi", "kivi", 0, 0, ragged_step.RaggedInPlace),
    "mixed": ("turboquant", "kivi", 0, 16, ragged_step.RaggedMixedInPlace),
    "mixed-windows": ("turboquant", "kivi", 16, 16, ragged_step.RaggedMixedWindowsInPlace),
    "kivi-keys": ("kivi", "turboquant", 16, 0, ragged_step.RaggedKiviKeysInPlace),
    "kivi-keys-windows": ("kivi", "turboquant", 16, 16, ragged_step.RaggedKiviKeysWindowsInPlace),
}


def _filled(s) -> np.ndarray:
    """s's window buffer with every element distinct (written in place): a view of other rows shows."""
    mx.eval(s._wbuf)
    a = np.array(memoryview(s._wbuf), copy=False)
    a[...] = (np.arange(a.size) % 2039).reshape(a.shape)
    return a


def _want(plan, s, role: int, a: np.ndarray) -> tuple:
    """The rows of buffer `a` the plan's (first, window after the step) of s are: a KIVI role's tokens at x .. x + G - 1
    where rows flush (else the chunk's row) and positions lo' .. idx'; a windowed per-token role's oldest row and the
    rest of its window with the chunk."""
    ws, lo, n, t = s._ws, s._lo, s._idx - s._lo, plan.t
    if s.params.method != "kivi":
        return a[:, :, ws:ws + t], a[:, :, ws + t:ws + n + t]
    flush = plan.flushing[role] > 0
    x = max(s._idx + t - s.params.window - G, 0)
    first = a[:, :, ws + x - lo:ws + x - lo + G] if flush else a[:, :, ws + n:ws + n + t]
    return first, a[:, :, ws + plan.encoded - lo:ws + n + t]


def _plan(tune, km, vm, kwin, vwin):
    """A ragged batch's streams (rows whose lengths differ mod G), a step's chunk and the plan check gives them."""
    tune(ragged=True)
    singles = filled_with(_maker(km, vm, kwin, vwin), [37, 50, 64 + 3, 21], seed=7)
    batch = type(singles[0]).merge(singles)
    k, v = batch.inner._k, batch.inner._v
    keys, values = kv(1, 300, b=4)
    return k, v, keys, values, ragged_step.RaggedInPlace.check(k, v, keys, values)


def _same_views(plan, k, v, bufs: dict, when: str) -> None:
    got = list(plan.windows())
    for i, s in enumerate((k, v)):
        if not plan.wins[i]:
            continue
        for name, g, w in zip(("first", "window"), got[:2], _want(plan, s, i, bufs[id(s)])):
            assert g.shape == w.shape and np.array_equal(np.array(g), w), f"{when} role {i}: {name}"
        del got[:2]
    assert not got


@pytest.mark.parametrize("km, vm, kwin, vwin, cls", CASES.values(), ids=CASES.keys())
def test_ragged_window_views_are_the_buffer_rows(tune, km, vm, kwin, vwin, cls):
    k, v, keys, values, plan = _plan(tune, km, vm, kwin, vwin)
    assert type(plan) is cls
    bufs = {id(s): _filled(s) for s in (k, v)}
    flushed, step = set(), 0
    while plan._room(k) and plan._room(v):
        _same_views(plan, k, v, bufs, f"step {step}")
        flushed |= {f for f, s in zip(plan.flushing, (k, v)) if s.params.method == "kivi"}
        plan.stored(None)
        step += 1
    assert step > G and flushed == {0, G}, (step, flushed)     # (steps that flush and steps that do not)
    with pytest.raises(ValueError, match="past the window buffer"):
        plan.windows()
    for s in (k, v):
        s._wflat = s._wbuf.reshape(-1)       # (a buffer the plan did not make)
    with pytest.raises(ValueError, match="not the plan's"):
        plan.windows()


def test_a_restored_mark_keeps_the_window_buffer_with_its_flattening(tune):
    """RaggedStream.mark / restore hold the window buffer together with its flattening (`_wflat`): a plan made after a
    restore to a mark taken before the buffer was made anew views the restored buffer's rows."""
    k, v, keys, values, plan = _plan(tune, "kivi", "kivi", 16, 16)
    marks = k.mark(), v.mark()
    for s, m in zip((k, v), marks):
        s._wview = None                 # (the window no longer the buffer's view: reserve makes the buffer anew)
        ragged_step.reserve(s, 1)
        assert s._wbuf is not m[8]
    k.restore(marks[0])
    v.restore(marks[1])
    plan = ragged_step.RaggedInPlace.check(k, v, keys, values)
    _same_views(plan, k, v, {id(s): _filled(s) for s in (k, v)}, "after the restore")
