"""The attention partial's ragged specialization (VQ_RAGGED: accelerated/cache/ragged.py's layout, each KIVI row of
its own group phase) through the kernel bodies run on the CPU (tests/test_attention_kernels_emulated.py's
emulation): the scalar loop with row starts, KIVI in both roles, window 0 and R > 0, without the append inside
(the ragged step's append is still the general path's: docs/ragged-kivi.md).

The records are the ragged B-row cache's own (merge of single caches of lengths differing mod G, then decode steps
crossing every row's flush); every byte a row must not read is poisoned (all bits set: NaN scales, zeros and
window tokens): its padding, its rows past its own boundary in the fields, its window slots below its own window.
Per row, the output is within the emulated tests' tolerance of float64 over its single cache's record, and of the
ops path over the same B-row cache.
"""
from __future__ import annotations

import shutil

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import layouts
from veloxquant.accelerated.cache import masks, ragged
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import backend
from veloxquant.accelerated.ops import attention as oatt
from _attention_util import f64_attention
from _batch_util import D, H, filled_with, kv, poisoned
import test_attention_kernels_emulated as emu   # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

G = 16
REP = 2


CASES = [("R0", 0, [37, 50, 64, 21]), ("R8", 8, [37, 50, 64, 5])]   # (R = 8: the 5-token row all window)


@pytest.fixture
def ragged_batch(monkeypatch, tune):
    """make(window, lengths) -> (the ragged B-row cache merged from kivi2 caches of those lengths, the same
    single caches again, the rows' left padding), with tuning's ragged on and 4 multiprocessors (split counts);
    the launch plans made here cleared after."""
    tune(ragged=True, tokens_per_split=24)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    katt._static.cache_clear()

    def make_batch(window, lengths):
        make = lambda: vc.KIVIKVCache(bits=2, group_size=G, seed=2, layer=1, window=window)   # noqa: E731
        batch = vc.KIVIKVCache.merge(filled_with(make, lengths, seed=7))
        assert ragged.is_ragged(batch.inner), "not one ragged B-row cache"
        return batch, filled_with(make, lengths, seed=7), batch.left_padding.tolist()
    yield make_batch
    katt._static.cache_clear()


@pytest.mark.parametrize("window, lengths", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_ragged_partial_attends_each_row_as_its_own_cache(window, lengths, ragged_batch):
    batch, singles, lp = ragged_batch(window, lengths)
    seen = set()
    for step in range(G + 1):
        k, v = kv(1, 900 + step, b=len(lengths))
        mask = masks.row_starts(batch.make_mask(1))
        assert type(mask) is oatt.RowStarts and list(mask.host) == lp
        kk, vv = batch.update_and_fetch(k, v)
        for i, c in enumerate(singles):
            c.update_and_fetch(k[i:i + 1], v[i:i + 1])
        if step % 4 and step != G:
            continue
        q = mx.random.normal((len(lengths), REP * H, 1, D), key=mx.random.key(40 + step)).astype(mx.float16)
        kr, vr = kk.record, vv.record
        assert isinstance(kr, oatt.RaggedRecord) and kr.encoded > 0, kr
        seen.add(tuple(batch.inner._k.bounds()))
        with pytest.MonkeyPatch.context() as m:
            m.setattr(backend, "available", lambda: (True, "emulated"))
            assert katt.supports(q, kr, vr, mask), "the kernels refuse the ragged step"
            plan = katt.launch_plan(q, kr, vr, D ** -0.5, mask)
        assert plan.key[7] and plan.key[8] and not plan.key[4] and "rphase" in plan.partial_names, plan.key
        got = emu.emulate(q, poisoned(kr, batch.inner._k), poisoned(vr, batch.inner._v), D ** -0.5, mask,
                          reverse=True)
        ops = np.array(oatt.attention(q, *(oatt.PackedRecord(r.params, {}, r.decoded(), 0) for r in (kr, vr)),
                                      D ** -0.5, mask))
        for i, c in enumerate(singles):
            want = f64_attention(np.array(q[i:i + 1].astype(mx.float32)), np.array(c._k.dequantized()),
                                 np.array(c._v.dequantized()), D ** -0.5, False)
            tol = 2e-3 * np.abs(want).max()
            for out, what in ((got, "the ragged partial (emulated)"), (ops, "the ops path")):
                np.testing.assert_allclose(out[i:i + 1], want, rtol=0, atol=tol,
                                           err_msg=f"step {step}: row {i}, {what} vs float64 over its own cache")
    assert len({b for bs in seen for b in bs}) > len(lengths), "the steps never moved the rows' boundaries apart"


# ---- the step's append inside the ragged partial (APPEND + VQ_RAGGED: each row flushes its group at its own step) ----
def _flush(stream: ragged.RaggedStream, idx: int) -> tuple[list[int], int]:
    """(the rows a step to idx positions flushes, their first position x): what the host knows (cache/ragged.py)."""
    p = stream.params
    before, after, ph = stream.bounds(idx - 1), stream.bounds(idx), ragged.phases(stream._pads, p)
    rows = [i for i, (b0, b1, f) in enumerate(zip(before, after, ph)) if b1 > max(b0, f)]
    return rows, idx - p.window - G


def _appended(rec, stream, rows: list, x: int) -> oatt.RaggedRecord:
    """rec (the state after the step) poisoned as poisoned does, and the rows the launch's append writes (the flushing
    rows' codes and values' scale / zero x .. x + G - 1, their keys' group row x // G) all bits set too."""
    rec = poisoned(rec, stream)
    grouped = layouts.of(stream.params).group_rows(stream.params.role)
    fields = {}
    for name, a in rec.fields.items():
        n = np.array(a).copy()
        lo, hi = (x // G, x // G + 1) if name in grouped else (x, x + G)
        for i in rows:
            n[i, :, lo:hi].view(np.uint8)[...] = 0xFF
        fields[name] = mx.array(n)
    return oatt.RaggedRecord(rec.params, fields, rec.window, rec.encoded, rec.decode_tokens, None, rec.phases,
                             rec.decoded)


def _fused_step(q, batch, before, x_new, mask):
    """The partial launch with the step's append inside over the ragged B-row cache (emulated, blocks reversed; at a
    flush in order too): (output, {input: the whole array as the launch left it}, token, summary, flushing rows, x)."""
    ks, vs = batch.inner._k, batch.inner._v
    kp, vp = ks.params, vs.params
    rows, x = _flush(ks, ks.tokens)
    own = int(bool(rows) and kp.window == 0)       # (R = 0: the group's last token is the chunk's own)
    leaving = []
    for (w0, lo0), xn in zip(before, x_new):
        both = mx.concatenate([w0, xn], axis=2)
        leaving.append(both[:, :, x - lo0:x - lo0 + G] if rows else xn)
    recs = [_appended(s.packed(), s, rows, x) for s in (ks, vs)]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(backend, "available", lambda: (True, "emulated"))
        assert katt.supports(q, *recs, mask), "the kernels refuse the ragged step"
    new = (x_new[0], x_new[1], kp, vp, False, tuple(leaving), G if rows else 0, own)
    got, part, token, summary = emu.emulate(q, *recs, D ** -0.5, mask, append=new, reverse=True)
    if rows:        # (blocks in order: a split reading the group before split S - 1 wrote it would read NaN)
        forward = emu.emulate(q, *recs, D ** -0.5, mask, append=new)[0]
        assert np.array_equal(forward, got), "the output depends on the launch's block order"
    whole = {n: a.base if n in emu._FIELD_INPUTS else a for n, a in part.items()}
    return got, whole, token, summary, rows, x


@pytest.mark.parametrize("window, lengths", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_ragged_partial_with_the_append_steps_each_row_as_its_own_cache(window, lengths, ragged_batch):
    """G + 1 decode steps of a ragged KIVI batch, each through the partial launch with its append inside: every row
    flushes its group at its own step, inside the launch (the others only copy the chunk into the window). After each
    step, each row's fields (from its first token to its own boundary) and its own window are, byte for byte, its
    single cache's after the same step, and its output is within the tolerance of float64 over that cache."""
    batch, singles, lp = ragged_batch(window, lengths)
    flushed = set()
    for step in range(G + 1):
        k, v = kv(1, 900 + step, b=len(lengths))
        mask = masks.row_starts(batch.make_mask(1))
        before = [(s._window, s._lo) for s in (batch.inner._k, batch.inner._v)]
        batch.update_and_fetch(k, v)
        for i, c in enumerate(singles):
            c.update_and_fetch(k[i:i + 1], v[i:i + 1])
        q = mx.random.normal((len(lengths), REP * H, 1, D), key=mx.random.key(40 + step)).astype(mx.float16)
        got, whole, token, summary, rows, x = _fused_step(q, batch, before, (k, v), mask)
        flushed.update(rows)
        assert not token.any() and not summary.any(), (step, token.tolist(), summary.tolist())
        _rows_are_their_caches(batch.inner, whole, singles, lp, f"step {step}")
        for i, c in enumerate(singles):
            want = f64_attention(np.array(q[i:i + 1].astype(mx.float32)), np.array(c._k.dequantized()),
                                 np.array(c._v.dequantized()), D ** -0.5, False)
            np.testing.assert_allclose(got[i:i + 1], want, rtol=0, atol=2e-3 * np.abs(want).max(),
                                       err_msg=f"step {step}: row {i} (flushing rows {rows}) vs float64")
    assert flushed == set(range(len(lengths))), f"the steps flushed rows {sorted(flushed)} only"


def _rows_are_their_caches(inner, whole, singles, lp, when):
    for role, s in (("k", inner._k), ("v", inner._v)):
        p, bnd = s.params, s.bounds()
        ph = ragged.phases(lp, p)
        grouped = layouts.of(p).group_rows(p.role)
        for i, (c, pad) in enumerate(zip(singles, lp)):
            own = (c._k if role == "k" else c._v).record()
            for kn, name in katt._field_names(p.method, role):
                lo, hi = ((pad - ph[i]) // G, max(bnd[i] - ph[i], 0) // G) if name in grouped else (pad, bnd[i])
                mine = whole[kn][i:i + 1, :, lo:max(hi, lo)]
                assert np.array_equal(mine.view(np.uint8), emu._strided(own[name], 0).view(np.uint8)), \
                    f"{when}: row {i} {role} {name} after the launch differs from its single cache's"
            w = whole[f"{role}w"][i:i + 1, :, max(bnd[i], pad) - s._lo:]
            assert np.array_equal(w.view(np.uint8), emu._strided(own["window"], 0).view(np.uint8)), \
                f"{when}: row {i}'s {role} window after the launch differs from its single cache's"
