"""A KIVI batch in one left-padded B-row cache (accelerated/cache/batch_shared.py: every row's left padding a whole
number of groups G) through the GPU decode step's kernel bodies, run on the CPU by the emulation of
tests/test_attention_kernels_emulated.py: the partial launch with the step's append inside (APPEND: a group flushed
by the same launch) and each row's start (STARTS: RowStarts, the rows' left padding), then the combine launch; the
scalar loop and the KIVI tensor-core loop (tuning's tc_kivi), KIVI in both roles and keys turboquant 3-bit beside
values KIVI 2-bit (the MIXED partial), without and with an exact window.

The states come from the caches themselves on the MLX ops path: the B-row cache that merge makes of the rows'
single-sequence caches, and each single cache, before and after one decode step. Per row, what the launch over B
rows leaves in the records (from the row's first position: its start, or its first key group) and its window are
the bytes its single cache holds after the same step and the bytes the same launch writes over that cache alone;
the row's output is within the emulated tests' tolerance of the single cache's launch and of float64 over the single
cache's own records. What the emulation leaves to a GPU run (the intrinsics, MLX's launch, the hardware's mma
accumulation; the decode step's Python, accelerated/kernels/decode_step.py, is tests/test_fast_path.py's) is
tests/test_attention_gpu.py's and tests/test_append_kernel_gpu.py's.
"""
from __future__ import annotations

import shutil

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import layouts
from veloxquant.accelerated.cache import masks
from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import attention_source as src
from veloxquant.accelerated.kernels import backend
from veloxquant.accelerated.ops import attention as oatt
from _attention_util import f64_attention
from _batch_util import D, H, filled_with, kv
import test_attention_kernels_emulated as emu   # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

G = 16          # KIVI's group
REP = 2         # query heads per KV head


def _cache(mixed: bool, window: int):
    if mixed:
        return vc.VeloxKVCache(key_method="turboquant", key_bits=3, value_method="kivi", value_bits=2, group_size=G,
                               seed=2, layer=1, window=window)
    return vc.KIVIKVCache(bits=2, group_size=G, seed=2, layer=1, window=window)


def _record(s) -> oatt.PackedRecord:
    r = s.record()
    return oatt.PackedRecord(s.params, {n: a for n, a in r.items() if n != "window"}, r["window"], s._q,
                             s._method.decode_tokens)


def _append(streams, x_new):
    """emulate's `append` items and the launch's records for one step of a cache whose streams are given per role
    as ((window, encoded count) before the step, the stream after it): each role's tokens leaving its window (KIVI
    at a flush: its oldest G; else any row, never read), the tokens the launch encodes (KIVI: G or 0; a per-token
    role: the chunk's 1) and the chunk's rows among them (KIVI with R = 0 at a flush: 1, the launch's window is
    then the chunk's row: in_place.InPlace.windows)."""
    leaving, nq, own, recs = [], [], [], []
    for ((w0, q0), after), x in zip(streams, x_new):
        p, rec = after.params, _record(after)
        if p.method == "kivi":
            flush = w0.shape[2] + 1 == p.window + G
            assert flush == (after._q == q0 + G), "KIVI flushes where its window reaches R + G"
            nq.append(G if flush else 0)
            own.append(int(flush and p.window == 0))
            both = mx.concatenate([w0, x], axis=2)
            leaving.append(both[:, :, :G] if flush else x)
            if own[-1]:
                rec = oatt.PackedRecord(p, rec.fields, x, rec.encoded, rec.decode_tokens)
        else:
            nq.append(1)
            own.append(0)
            leaving.append(w0[:, :, :1] if p.window else None)
        recs.append(rec)
    return leaving, nq, own, recs


def _launch(q, recs, append, mask, mixed, reverse=False, poison=True):
    """The partial launch with the append inside and row starts `mask`, then the combine (emu.emulate), the rows
    below the starts all bits set (`poison`: a row's padding attended would be NaN) or as stored."""
    kp, vp = recs[0].params, recs[1].params
    x, leaving, nq, own = append
    new = (x[0], x[1], kp, vp, True, tuple(leaving), tuple(nq) if mixed else nq[0], tuple(own) if mixed else own[0])
    with pytest.MonkeyPatch.context() as m:      # the decode step's launch: only where the kernels take the call
        m.setattr(backend, "available", lambda: (True, "emulated"))
        assert katt.supports(q, *recs, mask, mixed), "the kernels refuse this step"
    return emu.emulate(q, *recs, D ** -0.5, mask, append=new, poison_below=list(mask.host) if poison else None,
                       reverse=reverse, mixed=mixed)


def _per(p, role: str, name: str) -> int:
    return G if name in layouts.of(p).group_rows(role) else 1


def _bytes(a) -> np.ndarray:
    return (emu._strided(a, 0) if isinstance(a, mx.array) else a).view(np.uint8)


def _check_step(q, batch_pair, single_pairs, x, mask, mixed, tc, when):
    """One decode step's launch over the B rows, with the batch's RowStarts `mask`, against each row's single cache
    (see the module)."""
    leaving, nq, own, recs = _append(batch_pair, x)
    lp = mask.host
    plan = katt.launch_plan(q, *recs, D ** -0.5, mask, mixed=mixed)
    assert plan.key[7] and bool(plan.key[4]) == tc and (plan.key[2] in src.MIXED_WINDOWS) == mixed, plan.key
    got, rows, token, summary = _launch(q, recs, (x, leaving, nq, own), mask, mixed, reverse=True)
    forward = _launch(q, recs, (x, leaving, nq, own), mask, mixed, poison=False)[0]
    assert not token.any() and not summary.any(), (when, token.tolist(), summary.tolist())
    for i, (pair, s0) in enumerate(zip(single_pairs, lp)):
        xs = (x[0][i:i + 1], x[1][i:i + 1])
        s_leaving, s_nq, s_own, s_recs = _append(pair, xs)
        assert (s_nq, s_own) == (nq, own), f"{when}: row {i} flushes apart from the stream"
        alone = oatt.RowStarts(mx.array([0], dtype=mx.int32), False, None, (0,))    # (the same kernel text)
        s_got, s_rows, _, _ = _launch(q[i:i + 1], s_recs, (xs, s_leaving, s_nq, s_own), alone, mixed)
        for role, rec, s_rec in zip("kv", recs, s_recs):
            for kn, name in katt._field_names(rec.params.method, role):
                per = _per(rec.params, role, name)
                ops_b, ops_s = _record(batch_pair["kv".index(role)][1]), _record(pair["kv".index(role)][1])
                n_b, n_s = ops_b.fields[name].shape[2], ops_s.fields[name].shape[2]
                assert n_b - s0 // per == n_s, (when, i, role, name, n_b, n_s)
                row = rows[kn][i:i + 1, :, s0 // per:n_b]
                for other, what in ((ops_b.fields[name][i:i + 1, :, s0 // per:], "the B-row cache's (ops)"),
                                    (ops_s.fields[name], "its single cache's (ops)"),
                                    (s_rows[kn][:, :, :n_s], "the launch over its single cache")):
                    assert np.array_equal(row.view(np.uint8), _bytes(other)), \
                        f"{when}: row {i} {role} {name} after the launch differs from {what}"
            if f"{role}w" in rows:      # (the launch's window: with R = 0 at a flush the chunk's row)
                for other, what in ((s_rec.window, "its single cache's (ops)"),
                                    (s_rows[f"{role}w"], "the launch over its single cache")):
                    assert np.array_equal(rows[f"{role}w"][i:i + 1].view(np.uint8), _bytes(other)), \
                        f"{when}: row {i}'s {role} window after the launch differs from {what}"
        after = [_record(s[1]) for s in pair]
        qf = np.array(q[i:i + 1].astype(mx.float32))
        want = f64_attention(qf, np.array(after[0].dequantized()), np.array(after[1].dequantized()), D ** -0.5, False)
        tol = 2e-3 * np.abs(want).max()
        np.testing.assert_allclose(s_got, want, rtol=0, atol=tol, err_msg=f"{when}: row {i} alone vs float64")
        for out, how in ((forward, "padding as stored"), (got, "padding all bits set, blocks reversed")):
            np.testing.assert_allclose(out[i:i + 1], want, rtol=0, atol=tol, err_msg=f"{when}: row {i} vs float64 "
                                       f"({how})")
            np.testing.assert_allclose(out[i:i + 1], s_got, rtol=0, atol=tol,
                                       err_msg=f"{when}: row {i} of the batch vs its single cache's launch ({how})")
    assert np.array_equal(forward, got), f"{when}: the output depends on the launch's block order or the padding"


def _streams(c):
    return c._k, c._v


def _state(c):
    return [(s._window, s._q) for s in _streams(c)]


# (the rows' lengths are equal mod G and put the first step at a flush: R = 0, the window full at G - 1 tokens;
# R = 8, at R + G - 1; the shortest row's tokens are all in its window, its left padding reaching the stream's
# encoded tokens)
CASES = [   # id, keys turboquant 3 + values KIVI 2, window, tensor-core loop (tc_kivi; never MIXED), lengths
    ("kivi-R0-scalar", False, 0, False, [63, 15, 31]),
    ("kivi-R0-tc", False, 0, True, [63, 15, 31]),
    ("kivi-R8-scalar", False, 8, False, [71, 23, 39]),
    ("kivi-R8-tc", False, 8, True, [71, 23, 39]),
    ("tq3-kivi2-R0", True, 0, False, [63, 15, 31]),
    ("tq3-kivi2-R8", True, 8, False, [71, 23, 39]),
]


@pytest.mark.parametrize("mixed, window, tc, lengths", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_kivi_batch_steps_each_row_as_its_own_cache_through_the_kernels(mixed, window, tc, lengths, monkeypatch,
                                                                          tune):
    """Two decode steps of a KIVI B-row batch whose rows are whole groups apart (left padding 0, 3 G and 2 G), the
    first flushing a group in every row (the append inside the launch encodes it), the second not: per row, the
    records and window after the launch are its single cache's bytes, and its output is its single cache's within
    the tolerance tier (see the module). Splits of 24 tokens: the rows' starts fall inside splits."""
    tune(tokens_per_split=24, tc_kivi=tc)
    monkeypatch.setattr(katt, "_mma_available", lambda: tc)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    katt._static.cache_clear()
    try:
        singles = filled_with(lambda: _cache(mixed, window), lengths, seed=7)
        batch = type(singles[0]).merge(filled_with(lambda: _cache(mixed, window), lengths, seed=7))
        assert isinstance(batch, SharedBatchVeloxKVCache) and batch._seq is None, "not one B-row cache"
        lp = [max(lengths) - n for n in lengths]
        assert batch.left_padding.tolist() == lp and all(s % G == 0 for s in lp)
        for step in range(2):
            k, v = kv(1, 900 + step, b=len(lengths))
            q = mx.random.normal((len(lengths), REP * H, 1, D), key=mx.random.key(40 + step)).astype(mx.float16)
            mask = masks.row_starts(batch.make_mask(1))      # what the hooked dispatch hands the decode step
            assert type(mask) is oatt.RowStarts and mask.starts.tolist() == list(mask.host) == lp, mask
            before_b, before_s = _state(batch.inner), [_state(c) for c in singles]
            batch.update_and_fetch(k, v)
            for i, c in enumerate(singles):
                c.update_and_fetch(k[i:i + 1], v[i:i + 1])
            pair = list(zip(before_b, _streams(batch.inner)))
            assert all((b[1] < a._q) == (step == 0) for b, a in pair if a.params.method == "kivi"), \
                "the first step flushes a group, the second not"
            _check_step(q, pair, [list(zip(b, _streams(c))) for b, c in zip(before_s, singles)], (k, v), mask, mixed,
                        tc, f"step {step}")
    finally:
        katt._static.cache_clear()
