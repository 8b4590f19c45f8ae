"""Issue 29 item 4: the sliding-window cache (VeloxRotatingKVCache) on the fused decode step. Once full it evicts
its oldest tokens by skipping rows (Stream.evict: lo), so the step's launch reads the whole buffers with the encoded
count lo + Q and the row start lo (plus, for KIVI, the up to G - 1 held tokens older than the window that make_mask
hides). Checked here on the CPU: the launch's inputs name exactly the tokens mlx-lm's RotatingKVCache attends (rows
[rstart, nenc) of each field, one-shot encode's bytes of the held tokens, then the exact window), for the step and
for the general path it replaces. The kernel bodies (emulated) on the same steps, row start, exact window and the
append inside one launch: tests/test_rotating_step_emulated.py."""
from __future__ import annotations

import gc
import types

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base
from mlx_lm.models.cache import RotatingKVCache

from veloxquant.accelerated import kernels, ops
from veloxquant.accelerated.cache import VeloxRotatingKVCache
from veloxquant.accelerated.kernels import append as fused
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import backend, commit, decode_step
from veloxquant.accelerated.kernels import methods as km
from veloxquant.accelerated.ops import attention as oatt
from test_window_step import _Append, _Commit

B, HKV, HQ, D = 1, 2, 4, 64


class _Partial:
    """The attention launches' stand-in: records the partial's inputs (copied at launch), returns zeros."""

    def __init__(self, log, names):
        self.log, self.names = log, list(names)

    def specialized(self, template=None):
        return self

    def __call__(self, *, inputs, output_shapes, output_dtypes, **kw):
        if "nenc" in self.names:
            self.log.append({n: np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)
                             for n, a in zip(self.names, inputs)})
        return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]


def _clear_memos():
    for m in (fused, katt, km, commit, backend):
        for f in vars(m).values():
            if callable(getattr(f, "cache_clear", None)):
                f.cache_clear()


def install_backend(monkeypatch, cuda_kernel) -> None:
    """`cuda_kernel` as the "CUDA" backend's kernel factory, and no encode kernel (prefill through ops); the launch
    memos cleared, so that no launch a test before made is reused (release_backend clears them after)."""
    def no_encode(kind, method, dtype_name):
        raise NotImplementedError("stand-in: no encode kernel")
    monkeypatch.setattr(backend, "cuda_kernel", cuda_kernel)
    monkeypatch.setattr(backend, "kernel", no_encode)
    _clear_memos()


def release_backend() -> None:
    _clear_memos()
    km._RANGE.clear()
    gc.collect()


@pytest.fixture
def stand_in(monkeypatch, tune):
    """A "CUDA" backend: the append as its body computes it (test_window_step._Append: accelerated.ops' bytes written
    in place), the commit likewise, the attention launches recorded; no encode kernel (prefill through ops)."""
    ns = types.SimpleNamespace(params=None, partials=[], appends=0)
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("cuda", "stand-in"))
    monkeypatch.setattr(backend, "available", lambda: (True, "stand-in"))
    monkeypatch.setattr(kernels, "available", lambda: (True, "stand-in"))
    monkeypatch.setattr(katt, "_mma_available", lambda: False)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    tune(fuse_append=False)          # the append its own launch (the stand-in writes its bytes), then the attention

    def cuda_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True):
        if name.startswith("vq_commit"):
            return _Commit(list(input_names))
        if name.startswith("vq_attention"):
            return _Partial(ns.partials, input_names)
        assert name.startswith("vq_append") and name.endswith(("_w", "_w_b")), f"unexpected launch {name}"
        ns.appends += 1
        return _Append(ns.params, list(input_names))

    install_backend(monkeypatch, cuda_kernel)
    yield ns
    release_backend()


def _x(seed, t=1, h=HKV):
    return mx.array(np.random.default_rng(seed).standard_normal((B, h, t, D)).astype(np.float16))


def _attended(launch, stream, xs, n_ref, where):
    """The launch reads rows [rstart, nenc) of each field and then the window: they must be one-shot encode's of the
    tokens the cache holds (ending with the newest), and rstart must hide exactly the held tokens mlx-lm's cache no
    longer attends (held - n_ref: KIVI's group remainder, else none)."""
    p = stream.params
    held = stream.tokens
    want = ops.encode(mx.concatenate(xs, axis=2)[:, :, -held:], p)
    r = p.role
    q = held - want["window"].shape[2]
    nenc = int(launch["nenc"].reshape(-1)[0])
    lo = nenc - q
    start = int(launch["rstart"].reshape(-1)[0]) if "rstart" in launch else 0
    assert start - lo == held - n_ref, f"{where}: the launch attends from row {start}, the held tokens start at " \
                                       f"row {lo}, {held - n_ref} of them older than mlx-lm's window"
    for kn, name in katt._field_names(p.method, r):
        rows = stream._field_rows(name, 1)          # 1, or 0 for KIVI keys' scale and zero (a row per G tokens)
        g = 1 if rows else p.group_size
        got = launch[kn][:, :, lo // g:nenc // g]
        assert np.array_equal(got.view(np.uint8), np.array(want[name]).view(np.uint8)), \
            f"{where}: {r} {name} rows [{lo // g}, {nenc // g}) are not one-shot encode's of the held tokens"
    n = want["window"].shape[2]
    w = launch.get(f"{r}w", np.zeros((B, HKV, 0, D), np.float16))     # (no window input: a launch without one)
    if "wrow" in launch:        # (tuning's whole_windows: rows of the whole buffer from nenc, csrc/window_bind.h)
        wr, i = launch["wrow"].tolist(), "kv".index(r)
        w = launch[f"{r}wb"][:, :, nenc + wr[4 * i + 2]:nenc + wr[4 * i + 2] + wr[4 * i + 3]]
    assert np.array_equal(w[:, :, w.shape[2] - n:], np.array(want["window"])), f"{where}: {r} window"
    return lo


CASES = [
    ("turboquant-w4", dict(method="turboquant", bits=4, window=4), 16),
    ("mlx_affine-w4", dict(method="mlx_affine", bits=4, group_size=32, window=4), 16),
    ("kivi-w4", dict(method="kivi", bits=2, group_size=16, window=4), 40),
    ("kivi-w0", dict(method="kivi", bits=2, group_size=16, window=0), 40),
]


def _run(stand_in, monkeypatch, kw, max_size, general, steps=60):
    with monkeypatch.context() as m:
        if general:
            m.setattr(decode_step.DecodeStep, "holds", lambda self, keys, values: False)
        c = VeloxRotatingKVCache(max_size, layer=0, seed=3, **kw)
        ref = RotatingKVCache(max_size)
        stand_in.params = (c.key_params, c.value_params)
        ks, vs = [_x(7, t=5)], [_x(8, t=5)]
        c.update_and_fetch(ks[0], vs[0])
        ref.update_and_fetch(ks[0], vs[0])
        off, los = [], set()
        for i in range(steps):
            mask = c.make_mask(1)          # made before the update, as a model's forward makes it
            ks.append(_x(2 * i))
            vs.append(_x(2 * i + 1))
            stand_in.partials.clear()
            kk, vv = c.update_and_fetch(ks[-1], vs[-1])
            ref.update_and_fetch(ks[-1], vs[-1])
            if not (c._fast is not None and c._fast.k is c._k and kk.step is c._fast):
                off.append(i)
            base.scaled_dot_product_attention(_x(900 + i, h=HQ), kk, vv, cache=c, scale=D ** -0.5, mask=mask)
            if not stand_in.partials:      # nothing encoded yet (a window-only record): the ops path, as for VeloxKVCache
                assert c._k._q == 0 and c._v._q == 0, f"step {i}: no attention launch with encoded tokens"
                continue
            (launch,) = stand_in.partials
            for s, xs in ((c._k, ks), (c._v, vs)):
                los.add(_attended(launch, s, xs, ref.size(), f"step {i} ({'general' if general else 'fast'})"))
        return c, off, los


@pytest.mark.parametrize("name,kw,max_size", CASES, ids=[c[0] for c in CASES])
def test_the_step_attends_the_tokens_mlx_lms_sliding_window_holds(stand_in, monkeypatch, name, kw, max_size):
    """Past max_size every step evicts; the fused step (append launch, then the attention launch over the whole
    buffers from row lo) and the general path it replaces (views from lo) name the same held tokens, mlx-lm's,
    store the same bytes and keep the same rows."""
    cf, off, los = _run(stand_in, monkeypatch, kw, max_size, general=False)
    cg, off_g, los_g = _run(stand_in, monkeypatch, kw, max_size, general=True)
    # off the step: only until the first encoded tokens (a KIVI window fills R + G tokens first) and the step that
    # makes the plan; every step after, evictions and compactions included, on it
    assert max(off) < 16 and len(off_g) == 60, f"{name}: steps off the decode step {off}"
    assert max(los) > 0 and los_g == {0}, f"{name}: no step read past evicted rows ({sorted(los)}, {sorted(los_g)})"
    for a, b in ((cf._k, cg._k), (cf._v, cg._v)):
        ra, rb = a.record(), b.record()
        assert ra.keys() == rb.keys() and all(np.array_equal(np.array(ra[n]), np.array(rb[n])) for n in ra), \
            f"{name}: the stored records differ from the general path's"


@pytest.mark.parametrize("shift", [0, 1], ids=["as-made", "start-off-by-one"])
def test_a_wrong_start_offset_is_caught(stand_in, monkeypatch, shift):
    """The control of the check above: it fails when the launch's row start is one row off."""
    if shift:
        real_attend = decode_step.DecodeStep.attend

        def attend(self, queries, keys, values, scale, mask):
            if keys.lo and mask is None:       # rows from lo + 1: the newest held token but one, and one evicted
                mask = oatt.RowStarts(km.count(shift), host=(shift,))
            return real_attend(self, queries, keys, values, scale, mask)
        monkeypatch.setattr(decode_step.DecodeStep, "attend", attend)
        with pytest.raises(AssertionError, match="attends from row"):
            _run(stand_in, monkeypatch, CASES[0][1], CASES[0][2], general=False)
    else:
        _run(stand_in, monkeypatch, CASES[0][1], CASES[0][2], general=False)
