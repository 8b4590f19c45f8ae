"""Exact windows on the in-place decode step (kernels/append.py WINDOWED, in_place.InPlace.windows,
Stream._window_buffer): the stream state that many in-place steps leave (records, window, kept tokens) must be
one-shot encode's of the same tokens (spec/streaming.md), through the buffers' room running out, a trim, a rejected
chunk and a copied cache. No GPU here: the append kernel is stood in by what its body does (its bytes against
accelerated.ops are tests/test_append_kernel_emulated.py's): ops' encode of the tokens leaving each window written in
place into the record buffers from row `base`, the chunk copied into the window's last rows, NaN/Inf of the chunk
in the token. Prefill takes the ops path (encode kernels unavailable), so every stored byte is ops'."""
from __future__ import annotations

import copy
import gc
import types

import mlx.core as mx
import numpy as np
import pytest

from veloxquant.accelerated import kernels, ops
from veloxquant.accelerated.cache import VeloxKVCache
from veloxquant.accelerated.kernels import decode_step
from veloxquant.accelerated.kernels import append as fused
from veloxquant.accelerated.kernels import backend, commit
from veloxquant.accelerated.kernels import methods as km

B, H, D = 1, 2, 64
R, E = 4, 3              # window, exact_trim (kept tokens)


def _np_view(a: mx.array) -> np.ndarray:
    """A numpy array sharing `a`'s memory (a view of a buffer included): what a kernel writes in place."""
    mx.eval(a)
    return np.array(memoryview(a), copy=False)


class _Append:
    """The windowed append kernel as its body computes it, on the CPU (see the module docstring)."""

    def __init__(self, params, names):
        self.params, self.names, self.calls = params, names, 0

    def specialized(self, template=None):
        return self

    def __call__(self, *, inputs, output_shapes, output_dtypes, **kw):
        self.calls += 1
        a = dict(zip(self.names, inputs))
        base = int(a["base"].item())
        if "wrow" in a:     # (tuning's whole_windows: each role's kf and kw are rows of its whole buffer)
            a.update(_bound(a, base))
        tok = np.zeros(output_shapes[0], np.bool_)
        for i, (r, p) in enumerate(zip("kv", self.params)):
            leaving, chunk, win = a[f"{r}f"], a[f"{r}x"], a[f"{r}w"]
            t = chunk.shape[2]
            # the tokens it encodes: meta's Q in its constants (fused.constants; KIVI: 0 or a group of G, else t)
            sw = chunk.shape[1] * ((D + 31) // 32)
            meta = np.array(a[f"{r}const"])[2 * sw + 4 * fused.TABLE + 8:]
            nq, own = int(meta[5]), int(meta[7])      # own: the chunk's tokens among them (KIVI with R = 0)
            assert nq == t or p.method == "kivi" and nq in (0, p.group_size), (nq, t)
            if not nq:
                _np_view(win)[:, :, win.shape[2] - t:] = np.array(chunk)
                tok[i, 0, 0] = not np.isfinite(np.array(chunk.astype(mx.float32))).all()
                continue
            if own:     # kf's last rows are the chunk's rows of the window buffer, not written yet: from the chunk
                leaving = mx.concatenate([leaving[:, :, :nq - own], chunk[:, :, t - own:]], axis=2)
            fields = ops.method_module(p.method).encode_tokens(leaving[:, :, :nq].astype(mx.float32), p, leaving.dtype)
            for out, field in zip(("codes1", "codes2", "f_s1", "f_s2"), km.FIELDS[p.method]):
                if field:
                    rows = fields[field].shape[2]          # nq, or KIVI keys' scale and zero: nq / G
                    lo = base * rows // nq
                    _np_view(a[f"{r}{out}"])[:, :, lo:lo + rows] = np.array(fields[field])
            _np_view(win)[:, :, win.shape[2] - t:] = np.array(chunk)
            tok[i, 0, 0] = not np.isfinite(np.array(chunk.astype(mx.float32))).all()
        return [mx.array(tok)]


def _bound(a: dict, base: int) -> dict:
    """kf, kw, vf, vw of a launch that takes the window buffers whole (kwb, vwb) and wrow: [kf row, kf rows, kw row,
    kw rows] per role, rows relative to the role's first encoded row (base; MIXED's values: vbase), as
    csrc/window_bind.h binds them."""
    wr, out = np.array(a["wrow"]).tolist(), {}
    for i, r in enumerate("kv"):
        if f"{r}wb" in a:
            buf, c = a[f"{r}wb"], int(a["vbase"].item()) if r == "v" and "vbase" in a else base
            for j, n in ((0, "f"), (2, "w")):
                out[r + n] = buf[:, :, c + wr[4 * i + j]:c + wr[4 * i + j] + wr[4 * i + j + 1]]
    return out


class _Commit:
    """The commit kernel (kernels/commit.py) as its body computes it: each source written into its destination view,
    each check's hit (a flag set, or NaN/Inf in an array) in its row of the token."""

    def __init__(self, names):
        self.names = names

    def specialized(self, template=None):
        return self

    def __call__(self, *, inputs, output_shapes, output_dtypes, **kw):
        a = dict(zip(self.names, inputs))
        out = np.zeros(output_shapes[0], np.uint32)
        writes = sorted(n for n in a if n[0] == "w" and n.endswith("d"))
        for n in writes:
            _np_view(a[n])[...] = np.array(a[n[:-1] + "s"])
        checks = [x for n, x in a.items() if n != "after" and n[0] != "w"]
        for j, x in enumerate(checks):
            bad = np.array(x) if x.dtype == mx.bool_ else ~np.isfinite(np.array(x.astype(mx.float32)))
            out[j, 0] = bool(bad.any())
        return [mx.array(out)]


@pytest.fixture
def stand_in(monkeypatch, tune):
    """A "CUDA" backend whose windowed append is _Append; the encode kernel unavailable (ops' encode instead)."""
    ns = types.SimpleNamespace(made=[], params=None)     # the test sets params: (key, value) of its cache
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("cuda", "stand-in"))
    monkeypatch.setattr(backend, "available", lambda: (True, "stand-in"))
    monkeypatch.setattr(kernels, "available", lambda: (True, "stand-in"))
    tune(fuse_append=False)        # the append launched on its own: no attention needed

    def cuda_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True):
        if name.startswith("vq_commit"):      # the general path's store (a buffer growing)
            return _Commit(list(input_names))
        assert name.startswith("vq_append") and name.endswith(("_w", "_w_b")), f"unexpected launch {name}"
        ns.made.append(_Append(ns.params, list(input_names)))
        return ns.made[-1]

    def no_encode(kind, method, dtype_name):
        raise NotImplementedError("stand-in: no encode kernel")
    monkeypatch.setattr(backend, "cuda_kernel", cuda_kernel)
    monkeypatch.setattr(backend, "kernel", no_encode)
    for f in (fused._static_for, fused._kernel, fused.constants, commit._kernel):
        f.cache_clear()
    yield ns
    for f in (fused._static_for, fused._kernel, fused.constants, commit._kernel):
        f.cache_clear()
    km._RANGE.clear()
    gc.collect()


def _tokens(seed, t, nan=False):
    a = np.random.default_rng(seed).standard_normal((B, H, t, D)).astype(np.float16)
    if nan:
        a[0, 1, 0, 5] = np.nan
    return a


def _expect(c, ks, vs, kept_n=None):
    """The cache's streams against one-shot encode of the tokens ks / vs, and the kept tokens: the last `kept_n`
    encoded ones, exact (default C: E, KIVI's E in whole groups; fewer after a trim, which puts kept tokens back
    into the window)."""
    for s, xs, role in ((c._k, ks, "keys"), (c._v, vs, "values")):
        x = mx.array(np.concatenate(xs, axis=2))
        want = ops.encode(x, s.params)
        got = s.record()
        for n, w in want.items():
            assert got[n].shape == w.shape and np.array_equal(np.array(got[n]), np.array(w)), \
                f"{role} {n} after {x.shape[2]} tokens differs from one-shot encode"
        q = x.shape[2] - want["window"].shape[2]
        kept = np.array(s._kept) if s._kept is not None else np.zeros((B, H, 0, D), np.float16)
        n = s.params.kept_capacity() if kept_n is None else kept_n
        assert np.array_equal(kept, np.array(x[:, :, max(q - n, 0):q])), f"{role}: kept tokens {kept.shape} after {q}"


def _cache(method, window=R, **kw):
    c = VeloxKVCache(method=method, layer=0, seed=3, window=window, exact_trim=E, **kw)
    return c


@pytest.mark.parametrize("method,kw", [("turboquant", dict(bits=4)), ("mlx_affine", dict(bits=4, group_size=32)),
                                       ("turboquant_prod", dict(bits=3)), ("kivi", dict(bits=2, group_size=16)),
                                       ("kivi", dict(bits=2, group_size=16, window=0))])
@pytest.mark.parametrize("whole", [False, True], ids=["views", "whole-windows"])
def test_in_place_steps_keep_one_shot_state(stand_in, monkeypatch, tune, method, kw, whole):
    tune(whole_windows=whole)       # (the launch's kf and kw from its wrow: _bound)
    c = _cache(method, **kw)
    stand_in.params = (c.key_params, c.value_params)
    ks, vs = [_tokens(1, 7)], [_tokens(2, 7)]
    with monkeypatch.context() as m:      # prefill: no kernel at all (ops), as a CPU would store it
        m.setattr(backend, "available", lambda: (False, "prefill on ops"))
        c.update_and_fetch(mx.array(ks[0]), mx.array(vs[0]))
    steps = 0
    for i in range(520):       # past the record buffers' and the window buffer's room (256-row steps)
        ks.append(_tokens(10 + 2 * i, 1))
        vs.append(_tokens(11 + 2 * i, 1))
        c.update_and_fetch(mx.array(ks[-1]), mx.array(vs[-1]))
        steps += c._fast is not None and c._in_place is not None
        if i in (0, 1, 250, 251, 252, 253, 254, 300) or i > 500:
            _expect(c, ks, vs)
    assert sum(k.calls for k in stand_in.made) >= 500, "the windowed append did not take the steps"
    assert steps >= 500, f"DecodeStep held for {steps} of 520 steps"
    _expect(c, ks, vs)
    # a trim (the window refilled from the kept tokens), then in-place steps again
    w = c._k._window.shape[2]
    c.trim(2)
    ks[-1], vs[-1] = ks[-1][:, :, :0], vs[-1][:, :, :0]
    ks[-2], vs[-2] = ks[-2][:, :, :0], vs[-2][:, :, :0]
    # per-token: 2 kept tokens refill the window; KIVI (window R .. R + G - 1): none while it stays at R or more,
    # else a whole group (all C = G of them)
    _expect(c, ks, vs, kept_n=E - 2 if method != "kivi" else 0 if w - 2 < c.key_params.window else None)
    for i in range(5):
        ks.append(_tokens(5000 + i, 1))
        vs.append(_tokens(6000 + i, 1))
        c.update_and_fetch(mx.array(ks[-1]), mx.array(vs[-1]))
    _expect(c, ks, vs)
    # a copy appends into its own buffers: neither one's steps change the other's state
    d = copy.deepcopy(c)
    dk, dv = list(ks), list(vs)
    for i in range(2):
        dk.append(_tokens(7000 + i, 1))
        dv.append(_tokens(7100 + i, 1))
        d.update_and_fetch(mx.array(dk[-1]), mx.array(dv[-1]))
    _expect(c, ks, vs)
    for i in range(2):
        ks.append(_tokens(7200 + i, 1))
        vs.append(_tokens(7300 + i, 1))
        c.update_and_fetch(mx.array(ks[-1]), mx.array(vs[-1]))
    _expect(d, dk, dv)
    _expect(c, ks, vs)


@pytest.mark.parametrize("method,kw,n", [("turboquant", dict(bits=4), 9), ("kivi", dict(bits=2, group_size=16), 18),
                                         ("kivi", dict(bits=2, group_size=16, window=0), 14)])
@pytest.mark.parametrize("whole", [False, True], ids=["views", "whole-windows"])
def test_a_nan_chunk_is_rolled_back_to_the_window_before_it(stand_in, monkeypatch, tune, method, kw, n, whole):
    """(KIVI: the steps before the NaN chunk cross a group flush.)"""
    tune(whole_windows=whole)
    c = _cache(method, **kw)
    stand_in.params = (c.key_params, c.value_params)
    ks, vs = [_tokens(1, n)], [_tokens(2, n)]
    with monkeypatch.context() as m:
        m.setattr(backend, "available", lambda: (False, "prefill on ops"))
        c.update_and_fetch(mx.array(ks[0]), mx.array(vs[0]))
    for i in range(4):
        ks.append(_tokens(10 + i, 1))
        vs.append(_tokens(20 + i, 1))
        c.update_and_fetch(mx.array(ks[-1]), mx.array(vs[-1]))
    assert isinstance(c._fast, decode_step.DecodeStep)
    c.update_and_fetch(mx.array(_tokens(99, 1)), mx.array(_tokens(98, 1, nan=True)))   # values NaN: rejected later
    with pytest.raises(ValueError, match="values"):
        c.update_and_fetch(mx.array(_tokens(97, 1)), mx.array(_tokens(96, 1)))
        c.update_and_fetch(mx.array(_tokens(95, 1)), mx.array(_tokens(94, 1)))
    _expect(c, ks, vs)
    for i in range(3):     # and it goes on from the restored window
        ks.append(_tokens(40 + i, 1))
        vs.append(_tokens(50 + i, 1))
        c.update_and_fetch(mx.array(ks[-1]), mx.array(vs[-1]))
    _expect(c, ks, vs)
