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
from _batch_util import D, H, filled_with, kv
import test_attention_kernels_emulated as emu   # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

G = 16
REP = 2


def _poisoned(rec: oatt.RaggedRecord, stream: ragged.RaggedStream) -> oatt.RaggedRecord:
    """rec with every byte no row may read set to all ones: per row, field rows below its first token and past its
    own boundary, window slots outside its own window."""
    p, pads, bnd = stream.params, stream._pads, stream.bounds()
    ph = ragged.phases(pads, p)
    grouped = layouts.of(p).group_rows(p.role)
    fields = {}
    for name, a in rec.fields.items():
        n = np.array(a).copy()
        for i, (pad, bi, f) in enumerate(zip(pads, bnd, ph)):
            lo, hi = ((pad - f) // G, max(bi - f, 0) // G) if name in grouped else (pad, bi)
            n[i, :, :lo].view(np.uint8)[...] = 0xFF
            n[i, :, max(hi, lo):].view(np.uint8)[...] = 0xFF
        fields[name] = mx.array(n)
    w = np.array(rec.window).copy()
    for i, (pad, bi) in enumerate(zip(pads, bnd)):
        w[i, :, :max(bi, pad) - rec.encoded].view(np.uint8)[...] = 0xFF
    return oatt.RaggedRecord(rec.params, fields, mx.array(w), rec.encoded, rec.decode_tokens, None, rec.phases,
                             rec.decoded)


CASES = [("R0", 0, [37, 50, 64, 21]), ("R8", 8, [37, 50, 64, 5])]   # (R = 8: the 5-token row all window)


@pytest.mark.parametrize("window, lengths", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_ragged_partial_attends_each_row_as_its_own_cache(window, lengths, monkeypatch, tune):
    tune(ragged=True, tokens_per_split=24)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    katt._static.cache_clear()
    make = lambda: vc.KIVIKVCache(bits=2, group_size=G, seed=2, layer=1, window=window)   # noqa: E731
    try:
        batch = vc.KIVIKVCache.merge(filled_with(make, lengths, seed=7))
        singles = filled_with(make, lengths, seed=7)
        assert ragged.is_ragged(batch.inner), "not one ragged B-row cache"
        lp = batch.left_padding.tolist()
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
            got = emu.emulate(q, _poisoned(kr, batch.inner._k), _poisoned(vr, batch.inner._v), D ** -0.5, mask,
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
    finally:
        katt._static.cache_clear()
