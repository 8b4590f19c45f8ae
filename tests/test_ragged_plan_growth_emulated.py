"""A ragged batch's decode-step plan (cache/ragged_step.py) that runs out of room grows its buffers on the step
(cache/ragged_growth.py, DecodeStep._grown), as a single sequence's does (tests/test_plan_growth.py): every field
buffer of both streams and each window buffer made anew, their rows copied by one commit launch ordered after the
cache's last token, the plan and the step re-pointed; no general-path step, no host sync (no Stream.sync, no mx.eval
of the library's) in the steps. The launches run by the kernel bodies on the CPU
(tests/test_ragged_step_emulated.py's `bodies`), which write the cache's own buffers; ragged_step.ROOM is made small
so that a few dozen steps cross several growths. Each row's bytes and output after every step are its single
cache's (rse.rows_like_singles)."""
from __future__ import annotations

import sys

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import attention as vattention
from veloxquant.accelerated.cache import masks, ragged, ragged_growth, ragged_step
from veloxquant.accelerated.kernels import commit
from veloxquant.accelerated.kernels import methods as km
from veloxquant.accelerated.stream import Stream
from _batch_util import D, H, filled_with, kv
import test_ragged_kivi_keys_step_emulated as rkk
import test_ragged_mixed_step_emulated as rms
import test_ragged_step_emulated as rse
from test_ragged_step_emulated import bodies   # noqa: F401  (the fixture)

ROOM = 5
STEPS = 2 * 16 + 2         # (every phase flushes twice, some between growths)
G = 16


def _kivi(window):
    return lambda: vc.KIVIKVCache(bits=2, group_size=G, seed=2, layer=1, window=window)


# (name, maker, lengths, the append variant the bodies run); the KIVI pair's windows 8 and 0 and the mixed pair's
# values' window 128 as tests/test_ragged_*_step_emulated.py have them, and the windowed plans' sliding roles
CASES = [("kivi-R8", _kivi(8), [37, 50, 64, 5], None),
         ("kivi-R0", _kivi(0), [37, 50, 64, 21], None),
         ("mixed-g32-R128", rms._maker(32, 128), [200, 163, 181, 150], rse.MixedAppend),
         ("mixed-g16-R8-K8", rms._maker(16, 8, 8), [37, 50, 64, 21, 55], rse.MixedAppend),
         ("kivi-keys-g16-R8-V8", rkk._maker(16, 8, vwin=8), [37, 50, 64, 21, 55], rkk._KeysAppend)]
IDS = [c[0] for c in CASES]


def _library(frame) -> bool:
    name = frame.f_globals.get("__name__", "")
    return name.startswith("veloxquant.") or name.startswith("accelerated.")


@pytest.fixture
def growing(bodies, monkeypatch):   # noqa: F811
    """The bodies with a small ROOM and counters while a step runs (`counting`): host syncs (Stream.sync), the
    library's mx.eval calls, each growth's (after, token, its commit launches), each token a launch orders after
    (km.order)."""
    ns = bodies
    monkeypatch.setattr(ragged_step, "ROOM", ROOM)
    ns.counting, ns.syncs, ns.evals, ns.grown, ns.commits, ns.ordered = False, 0, [], [], [], []
    sync, ev, store, grow, order = Stream.sync, mx.eval, commit.commit, ragged_growth.grow, km.order

    def counted_sync(self):
        ns.syncs += ns.counting     # (any call: in generation the streams hold a token here; the rows' checks
        return sync(self)           # between the steps sync them)

    def counted_eval(*args, **kw):
        f = sys._getframe(1)
        if ns.counting and _library(f):
            ns.evals.append(f"{f.f_globals['__name__']}.{f.f_code.co_name}")
        return ev(*args, **kw)

    def spied_commit(writes, checks, after=None, columns=None):
        out = store(writes, checks, after, columns)
        ns.commits.append((list(writes), after, out))
        return out

    def spied_grow(plan, after, room):
        n0 = len(ns.commits)
        token = grow(plan, after, room)
        ns.grown.append((after, token, ns.commits[n0:]))
        return token

    def spied_order(token):
        ns.ordered.append(token)
        return order(token)
    monkeypatch.setattr(Stream, "sync", counted_sync)
    monkeypatch.setattr(mx, "eval", counted_eval)
    monkeypatch.setattr(commit, "commit", spied_commit)
    monkeypatch.setattr(ragged_growth, "grow", spied_grow)
    monkeypatch.setattr(km, "order", spied_order)
    return ns


def _batch(ns, monkeypatch, case, seeds):
    _, make, lengths, append = case
    if append is not None:
        monkeypatch.setattr(rse, "_Append", append)
    want = rse._singles(make, lengths, seeds)
    batch = vc.VeloxKVCache.merge(filled_with(make, lengths, seed=7))
    assert ragged.is_ragged(batch.inner), "not one ragged B-row cache"
    return batch, want


def _step(ns, batch, seed: int, want, when: str, bad: bool = False) -> bool:
    """One decode step and its attention (rse._step's; `bad`: row 1's keys NaN, nothing checked), counted; unless
    `bad`, each row checked against `want`. Returns whether the plan grew in it, after checking each growth's order:
    its one commit launch after the cache's last token (the previous step's), its token the next launch's `after`."""
    b = len(want) if want is not None else len(batch.left_padding.tolist())
    k, v = kv(1, seed, b=b)
    if bad:
        k = mx.concatenate([k[:1], mx.full(k[1:2].shape, float("nan"), dtype=k.dtype), k[2:]])
    q = mx.random.normal((b, rse.REP * H, 1, D), key=mx.random.key(seed)).astype(mx.float16)
    mask = masks.row_starts(batch.make_mask(1))
    n0, c = len(ns.grown), batch.inner
    last = c._token
    ns.ordered.clear()
    ns.counting = True
    try:
        kk, vv = batch.update_and_fetch(k, v)
        out = vattention.attend(q, kk, vv, D ** -0.5, mask)
    finally:
        ns.counting = False
    for after, token, launches in ns.grown[n0:]:
        assert after is last and after is not None, "the growth is not ordered after the cache's last token"
        assert len(launches) == 1 and launches[0][1] is after and launches[0][2] is token, "not one ordered copy"
        assert any(o is token for o in ns.ordered), "the step's append is not ordered after the growth's copy"
    if not bad:
        out = np.array(out.astype(mx.float32))
        ks, vs, lp = c._k, c._v, batch.left_padding.tolist()
        rse.rows_like_singles(want, lambda i: (ks.row(i), vs.row(i)), q, out, when, lp)
    return len(ns.grown) > n0


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_ragged_plan_grows_on_the_decode_step(growing, monkeypatch, tune, case):
    ns = growing
    seeds = [900 + s for s in range(STEPS)]
    batch, want = _batch(ns, monkeypatch, case, seeds)
    _step(ns, batch, seeds[0], want[0], "step 0")       # (the plan and its DecodeStep: reserve syncs once)
    c = batch.inner
    fast, plan = c._fast, c._in_place
    assert fast is not None and isinstance(plan, ragged_step.RaggedInPlace), (fast, plan)
    ns.syncs, ns.evals[:] = 0, []
    grew, bufs = 0, {}        # (the arrays held: no id reused)
    for s in range(1, STEPS):
        bufs.update((id(a), a) for a in (*plan.kbufs.values(), *plan.vbufs.values(), c._k._wbuf, c._v._wbuf))
        grew += _step(ns, batch, seeds[s], want[s], f"step {s}")
        assert c._fast is fast and c._in_place is plan, f"step {s} left the decode step"
    assert ns.syncs == 0, f"{ns.syncs} host syncs in the decode steps"
    assert not ns.evals, f"mx.eval in the decode steps: {ns.evals}"
    nbufs = len(plan.kbufs) + len(plan.vbufs) + 2
    assert grew >= 2 and len(bufs) >= (grew + 1) * nbufs, f"{grew} growths, {len(bufs)} buffers"
    assert all(len(w) == len(ns.grown[0][2][0][0]) for _, _, ((w, _, _),) in ns.grown), "write lists differ"


@pytest.mark.parametrize("at", [0, -1], ids=["nan-at-growth", "nan-before-growth"])
@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=[IDS[0], IDS[2]])
def test_a_nan_chunk_at_a_ragged_growth_is_rolled_back_like_the_general_path(growing, monkeypatch, tune, case, at):
    """The same steps on a batch whose plan never grows (the general path, then a new plan: `reserve`) give the same
    error at the same step and rows back before the bad chunk, then each row its single cache's through later steps
    (another growth among them)."""
    ns = growing
    seeds = [900 + s for s in range(STEPS)]
    batch, want = _batch(ns, monkeypatch, case, seeds)
    first = next(s for s in range(STEPS) if _step(ns, batch, seeds[s], want[s], f"step {s}"))
    good = first + at
    later = [950 + j for j in range(2 * ROOM + 2)]
    want = rse._singles(case[1], case[2], seeds[:good] + later)
    out = []
    for grows in (True, False):
        with monkeypatch.context() as m:
            if not grows:
                m.setattr(ragged_step.RaggedInPlace, "grow", lambda self, after: None)
            batch, _ = _batch(ns, monkeypatch, case, seeds[:1])
            for s in range(good):
                _step(ns, batch, seeds[s], want[s], f"step {s}")
            n0 = len(ns.grown)
            err = None
            try:
                _step(ns, batch, 905, None, "the bad step", bad=True)
                assert not grows or at == -1 or len(ns.grown) > n0, "the NaN chunk's step did not grow the plan"
                for s in range(3):
                    batch.update_and_fetch(*kv(1, 906 + s, b=len(case[2])))
                batch.check()
            except ValueError as e:
                err = str(e)
            assert err is not None and "keys" in err, "the NaN chunk was not rejected"
            assert batch.offset.tolist() == [max(case[2]) + good - p for p in batch.left_padding.tolist()]
            grew = len(ns.grown)
            for j, s in enumerate(later):
                _step(ns, batch, s, want[good + j], f"step {j} after the rollback")
            assert not grows or len(ns.grown) > grew, "no growth after the rollback"
            c = batch.inner
            out.append((err, {(r, i, n): np.array(a) for r, s in enumerate((c._k, c._v)) for i in range(len(case[2]))
                              for n, a in s.row(i).items()}))
    (e1, r1), (e2, r2) = out
    assert e1 == e2, f"{e1!r} against the general path's {e2!r}"
    assert r1.keys() == r2.keys() and all(np.array_equal(r1[n], r2[n]) for n in r1), "not the general path's rows"
