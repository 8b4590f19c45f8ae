"""A decode-step plan that runs out of room grows its buffers itself (in_place.InPlace.grow, DecodeStep._grown): the
record buffers and the exact window's buffer made anew, their rows copied by one commit launch ordered after the
cache's last token, and the step re-pointed at them; no general-path step, no host sync, and the stream state that
one-shot encode of the same tokens gives (tests/test_window_step.py's stand-in kernels, which really write in place).
The buffers grow in steps of 16 rows here (stream._Rows.step) so that a few hundred steps cross several growths."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import mlx.core as mx

from veloxquant.accelerated import in_place as ip
from veloxquant.accelerated import stream as st
from veloxquant.accelerated.cache import VeloxKVCache
from veloxquant.accelerated.kernels import backend, commit
from veloxquant.accelerated.kernels import methods as km
from veloxquant.accelerated.kernels import decode_step
import test_decode_step as tds
import test_window_step as tws
from test_decode_step import gpu   # noqa: F401  (the fixture)
from test_window_step import _tokens, stand_in   # noqa: F401  (the fixture)

STEP = 16


class _Append(tws._Append):
    """tws._Append for both kinds of launch: each role with its own window or none (kernels/append.py MIXED: the
    windowless role encodes its chunk from row `base`, the values from row `vbase`)."""

    def __call__(self, *, inputs, output_shapes, output_dtypes, **kw):
        self.calls += 1
        a = dict(zip(self.names, inputs))
        if "wrow" in a:     # (tuning's whole_windows: kf and kw as rows of the whole buffers)
            a.update(tws._bound(a, int(a["base"].item())))
        tok = np.zeros(output_shapes[0], np.bool_)
        for i, (r, p) in enumerate(zip("kv", self.params)):
            chunk = a[f"{r}x"]
            t, win = chunk.shape[2], a.get(f"{r}w")
            base = int(a["vbase" if r == "v" and "vbase" in a else "base"].item())
            sw = chunk.shape[1] * ((chunk.shape[3] + 31) // 32)
            meta = np.array(a[f"{r}const"])[2 * sw + 4 * tws.fused.TABLE + 8:]
            nq, own = int(meta[5]), int(meta[7])
            tok[i, 0, 0] = not np.isfinite(np.array(chunk.astype(mx.float32))).all()
            if nq:
                leaving = a.get(f"{r}f", chunk)
                if own:
                    leaving = mx.concatenate([leaving[:, :, :nq - own], chunk[:, :, t - own:]], axis=2)
                fields = tws.ops.method_module(p.method).encode_tokens(leaving[:, :, :nq].astype(mx.float32), p,
                                                                       leaving.dtype)
                for out, field in zip(("codes1", "codes2", "f_s1", "f_s2"), km.FIELDS[p.method]):
                    if field:
                        rows = fields[field].shape[2]
                        lo = base * rows // nq
                        tws._np_view(a[f"{r}{out}"])[:, :, lo:lo + rows] = np.array(fields[field])
            if win is not None:
                tws._np_view(win)[:, :, win.shape[2] - t:] = np.array(chunk)
        return [mx.array(tok)]


@pytest.fixture
def grows(stand_in, monkeypatch):
    """The stand-ins with any append variant, small growth steps, and counters: general-path steps (Stream.prepare),
    host syncs (Stream.sync with a token to wait for), each grow's (after, token), each token a step orders after."""
    ns = stand_in
    monkeypatch.setattr(tws, "_Append", _Append)
    real_kernel = backend.cuda_kernel

    def cuda_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True):
        if name.startswith("vq_append"):
            ns.made.append(_Append(ns.params, list(input_names)))
            return ns.made[-1]
        return real_kernel(name, input_names, output_names, source, header, ensure_row_contiguous)
    monkeypatch.setattr(backend, "cuda_kernel", cuda_kernel)
    monkeypatch.setattr(st._Rows, "step", STEP)
    ns.prepares, ns.syncs, ns.step_syncs, ns.grown, ns.ordered = 0, 0, 0, [], []
    prepare, sync, grow, order, store = st.Stream.prepare, st.Stream.sync, ip.InPlace.grow, km.order, commit.commit

    def counted_prepare(self, x):
        ns.prepares += 1
        return prepare(self, x)

    def counted_sync(self):
        ns.syncs += self._token is not None
        return sync(self)

    def spied_grow(self, after):
        n0 = len(ns.commits)
        token = grow(self, after)
        ns.grown.append((after, token, ns.commits[n0:]))
        return token

    def spied_order(token):
        ns.ordered.append(token)
        return order(token)
    ns.commits = []

    def spied_commit(writes, checks, after=None, columns=None):
        out = store(writes, checks, after, columns)
        ns.commits.append((writes, after, out))
        return out
    monkeypatch.setattr(st.Stream, "prepare", counted_prepare)
    monkeypatch.setattr(st.Stream, "sync", counted_sync)
    monkeypatch.setattr(ip.InPlace, "grow", spied_grow)
    monkeypatch.setattr(km, "order", spied_order)
    monkeypatch.setattr(commit, "commit", spied_commit)
    return ns


CACHES = {"turboquant-window4": dict(method="turboquant", bits=4, window=4),
          "kivi-window": dict(method="kivi", bits=2, group_size=16, window=8),
          "kivi-window0": dict(method="kivi", bits=2, group_size=16, window=0),
          "keys-turboquant-values-kivi": dict(key_method="turboquant", key_bits=4, value_method="kivi", value_bits=2,
                                              group_size=16, window=None)}     # (values' R made 16: _make)


def _make(grows, monkeypatch, name, n0=40):
    kw = dict(CACHES[name])
    kw.setdefault("method", None)
    c = VeloxKVCache(layer=0, seed=3, exact_trim=tws.E, **kw)
    if c.key_params.window != c.value_params.window:      # keys R = 0 beside KIVI values with a short window
        c.value_params = dataclasses.replace(c.value_params, window=16)
    grows.params = (c.key_params, c.value_params)
    ks, vs = [_tokens(1, n0)], [_tokens(2, n0)]
    with monkeypatch.context() as m:      # prefill on ops (no kernel), as test_window_step's
        m.setattr(backend, "available", lambda: (False, "prefill on ops"))
        c.update_and_fetch(mx.array(ks[0]), mx.array(vs[0]))
    return c, ks, vs


def _step(grows, c, ks, vs, seed, nan=False):
    """One decode step; returns whether the plan grew in it (and checks the grow's ordering: after the cache's last
    token, the previous append's, its own token the next append's `after`)."""
    n0 = len(grows.grown)
    ks.append(_tokens(seed, 1))
    vs.append(_tokens(seed + 1, 1, nan=nan))
    s0 = grows.syncs
    c.update_and_fetch(mx.array(ks[-1]), mx.array(vs[-1]))
    grows.step_syncs += grows.syncs - s0
    for after, token, launches in grows.grown[n0:]:
        prev = next(r for r in c._chunks if r.index == c._appends - 1)    # (fuse_append: this step's is pending)
        assert after is prev.flags, "the grow is not ordered after the cache's last token"
        assert len(launches) <= 1 and (not launches or launches[0][2] is token), "not one copy launch"
        assert any(o is token for o in grows.ordered), "the step's append is not ordered after the grow's copy"
    grows.ordered.clear()
    return len(grows.grown) > n0


def _expect(c, ks, vs):
    """tws._expect: the streams' records against one-shot encode of ks / vs, and the kept tokens (each stream's C:
    none for keys with R = 0 beside KIVI values)."""
    for s, xs, role in ((c._k, ks, "keys"), (c._v, vs, "values")):
        x = mx.array(np.concatenate(xs, axis=2))
        want = tws.ops.encode(x, s.params)
        got = s.record()
        for n, w in want.items():
            assert got[n].shape == w.shape and np.array_equal(np.array(got[n]), np.array(w)), \
                f"{role} {n} after {x.shape[2]} tokens differs from one-shot encode"
        q = x.shape[2] - want["window"].shape[2]
        kept = np.array(s._kept) if s._kept is not None else np.zeros((*x.shape[:2], 0, x.shape[3]), np.float16)
        assert np.array_equal(kept, np.array(x[:, :, max(q - s._cap, 0):q])), f"{role}: kept tokens after {q}"


def _settled(c):
    c._flush_step()      # (fuse_append: the last append, left for an attention launch the test does not make)


@pytest.mark.parametrize("fuse", [False, True], ids=["append-launch", "fuse-append"])
@pytest.mark.parametrize("name", list(CACHES))
@pytest.mark.parametrize("whole", [False, True], ids=["views", "whole-windows"])
def test_a_windowed_cache_grows_on_the_decode_step(grows, monkeypatch, tune, name, fuse, whole):
    tune(fuse_append=fuse, whole_windows=whole)     # (whole: the append's kf and kw from its grown buffers and wrow)
    c, ks, vs = _make(grows, monkeypatch, name)
    for i in range(2):       # the plan and its DecodeStep
        _step(grows, c, ks, vs, 3 + 2 * i)
    fast, plan = c._fast, c._in_place
    assert fast is not None and plan is not None
    grows.prepares = grows.step_syncs = 0
    grew, wbufs = 0, set()
    for i in range(150):
        wbufs |= {id(s._wflat) for s in (c._k, c._v) if s._wflat is not None}
        if _step(grows, c, ks, vs, 10 + 2 * i):
            grew += 1
            _settled(c)
            _expect(c, ks, vs)
        assert c._fast is fast and c._in_place is plan, f"step {i} left the decode step"
    assert grows.prepares == 0, f"{grows.prepares} general-path stream appends"
    assert grows.step_syncs == 0, f"{grows.step_syncs} host syncs in the decode steps"
    rows = max(r.buf.shape[2] for s in (c._k, c._v) for r in s._rows.values())
    assert grew >= 4 and rows > 4 * STEP and len(wbufs) >= 4, f"{grew} growths, {rows} rows, {len(wbufs)} windows"
    _settled(c)
    _expect(c, ks, vs)


@pytest.mark.parametrize("fuse", [False, True], ids=["append-launch", "fuse-append"])
@pytest.mark.parametrize("at", [0, -1], ids=["nan-at-growth", "nan-before-growth"])
@pytest.mark.parametrize("name", ["turboquant-window4", "kivi-window", "keys-turboquant-values-kivi"])
def test_a_nan_chunk_at_a_growth_is_rolled_back_like_the_general_path(grows, monkeypatch, tune, name, at, fuse):
    """The same steps on a cache whose plan never grows (today's general-path growth) give the same error at the same
    step, and the same state after it and after more steps."""
    tune(fuse_append=fuse)
    c, ks, vs = _make(grows, monkeypatch, name)
    first = next(i for i in range(400) if _step(grows, c, ks, vs, 100 + 2 * i))     # the step of the first growth
    out = []
    for growing in (True, False):
        with monkeypatch.context() as m:
            if not growing:
                m.setattr(ip.InPlace, "grow", lambda self, after: None)
            c, ks, vs = _make(grows, monkeypatch, name)
            n0 = len(grows.grown)
            for i in range(first + at):
                _step(grows, c, ks, vs, 100 + 2 * i)
            bad_k, bad_v = list(ks), list(vs)
            err = None
            try:
                _step(grows, c, bad_k, bad_v, 50, nan=True)
                if growing:
                    assert len(grows.grown) > n0 or at == -1, "the NaN chunk's step did not grow the plan"
                _step(grows, c, list(ks), list(vs), 60)
                _step(grows, c, list(ks), list(vs), 62)
            except ValueError as e:
                err = str(e)
            assert err is not None and "values" in err, "the NaN chunk was not rejected"
            _settled(c)
            _expect(c, ks, vs)
            for j in range(2 * STEP):      # and it goes on from the restored state (through another growth)
                _step(grows, c, ks, vs, 70 + 2 * j)
            _settled(c)
            _expect(c, ks, vs)
            out.append((err, c.offset, {(i, n): np.array(a) for i, s in enumerate((c._k, c._v))
                                        for n, a in s.record().items()}))
    (e1, o1, r1), (e2, o2, r2) = out
    assert e1 == e2 and o1 == o2, f"{e1!r} at offset {o1} against the general path's {e2!r} at {o2}"
    assert r1.keys() == r2.keys() and all(np.array_equal(r1[n], r2[n]) for n in r1), "not the general path's state"


@pytest.mark.parametrize("kw", [dict(method="turboquant", bits=4), dict(method="mlx_affine", bits=4, group_size=32),
                                dict(method="turboquant_prod", bits=3), dict(method="rabitq", bits=1)],
                         ids=lambda kw: kw["method"])
def test_the_attention_after_a_growth_reads_the_grown_buffers(monkeypatch, gpu, kw):
    """Recorded launches (tests/test_decode_step.py): through growths of a window-0 cache's buffers, every step's
    attention launch is the general path's (the same inputs, buffers of the same rows), while the steps stay on
    the DecodeStep; the attention launch parts made before a growth held the old buffers."""
    monkeypatch.setattr(st._Rows, "step", STEP)
    steps, held = 3 * STEP, []
    make = lambda: VeloxKVCache(layer=0, seed=3, **kw)      # noqa: E731
    real = decode_step.DecodeStep.step

    def spy(self, keys, values):
        held.append(self)
        return real(self, keys, values)
    with monkeypatch.context() as m:
        m.setattr(decode_step.DecodeStep, "step", spy)
        fast, err, c = tds._run(monkeypatch, gpu, False, False, steps=steps, make=make)
    ref, err_ref, _ = tds._run(monkeypatch, gpu, True, False, steps=steps, make=make)
    assert err is None and err_ref is None
    assert len(held) == steps - 1 and len(set(map(id, held))) == 1, "a step left the DecodeStep"
    grew = 0
    for i, (a, b) in enumerate(zip(fast, ref)):
        growth = any(x["name"].startswith("vq_commit") for x in a[0])
        grew += growth
        att = [[x for x in y[0] if x["name"].startswith("vq_attention")] for y in (a, b)]
        if growth:      # the input that orders the launch: the step's append token, the general path's commit token
            att = [[{**x, "inputs": [p for n, p in zip(x["names"], x["inputs"]) if n != "flags"]} for x in y]
                   for y in att]
        tds._same(*att, f"step {i}")
        assert a[1:] == b[1:], f"step {i}: offset, counts or chunk records differ"
    assert grew >= 2, f"{grew} growths"


def test_keys_from_before_a_growth_attend_over_their_buffers_and_leave_the_next_steps_theirs(monkeypatch, tune, gpu):
    """An older step's keys/values attended after a growth (test_decode_step's older-step test, across a growth)
    read the buffers of their step; the growth step's attention then reads the grown buffers: the launch parts made
    for the older keys are not the step's cached ones. Every launch is the general path's (the append launched alone:
    with fuse_append the growth step's attention takes its append, which the general path's does not)."""
    monkeypatch.setattr(st._Rows, "step", STEP)
    monkeypatch.setattr(tds.katt, "_mma_available", lambda: False)

    def run(general):
        with monkeypatch.context() as m:
            c = tds._prefilled(m, general)
            old = None
            for i in range(2 * STEP):
                n = len(gpu)
                kv = c.update_and_fetch(tds._x(2 * i), tds._x(2 * i + 1))
                if any(x["name"].startswith("vq_commit") for x in gpu[n:]) and i > 2:
                    break
                old = kv
            gpu.clear()
            for k, v in (old, kv):           # the older step's first, then the growth step's own
                tds.base.scaled_dot_product_attention(tds._x(1000, h=tds.HQ), k, v, cache=c, scale=tds.D ** -0.5,
                                                      mask=None)
            return [x for x in gpu if x["name"].startswith("vq_attention")]
    # (the input that orders a launch, `flags`, left out: the growth step's token is a commit's on the general path)
    fast, ref = ([{**x, "inputs": [p for n, p in zip(x["names"], x["inputs"]) if n != "flags"]} for x in run(g)]
                 for g in (False, True))
    assert len(fast) >= 2, "the older keys and the growth step's did not both take the fused launch"
    tds._same(fast, ref, "older keys, then the growth step's")
