"""accelerated/kernels/decode_step.py: the decode step with its per-shape work made once must launch exactly what
the general path launches (same kernels, templates, grids, output shapes, input values, the cache's own
buffers), keep the same state (offsets, row counts, deferred-check records) and reject a faulty chunk the same
way (one append later, rolled back). GPU launches are replaced by recorders here (the kernels' bytes are
tested elsewhere); the fake append kernel reports NaN in a chunk in its token as the real one does."""
from __future__ import annotations

import dataclasses

import copy
import gc

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base

from veloxquant.accelerated import attention as vattention
from veloxquant.accelerated import kernels, tuning
from veloxquant.accelerated.cache import VeloxKVCache, VeloxRotatingKVCache
from veloxquant.accelerated.kernels import decode_step
from veloxquant.accelerated.cache import base as cache_base
from veloxquant.accelerated.kernels import append as fused
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import backend
from veloxquant.accelerated.kernels import commit
from veloxquant.accelerated.kernels import methods as km

B, HQ, HKV, D = 1, 8, 2, 64


class _Recorder:
    """Stands in for a compiled kernel: records each launch, returns zeros (the append's token: NaN/Inf of
    each role's chunk in slot [role][0][0], as the kernel's; the combine after an APPEND partial: its summary)."""

    def __init__(self, log, name, input_names):
        self.log, self.name, self.input_names = log, name, list(input_names)

    def specialized(self, template=None):
        return self

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None, **kw):
        self.log.append(dict(name=self.name, names=self.input_names, template=list(template or []), grid=tuple(grid),
                             group=tuple(threadgroup), shapes=[tuple(s) for s in output_shapes],
                             inputs=[np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)
                                     for a in inputs], ids=[id(a) for a in inputs]))
        outs = [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]
        if self.name.startswith("vq_append") or "kx" in self.input_names:    # the append, or APPEND's partial
            ix, iv = self.input_names.index("kx"), self.input_names.index("vx")
            bad = [bool(mx.any(mx.isnan(inputs[i])).item()) for i in (ix, iv)]
            at = 0 if self.name.startswith("vq_append") else 2
            tok = np.zeros(output_shapes[at], np.bool_)
            tok[0, 0, 0], tok[1, 0, 0] = bad
            outs[at] = mx.array(tok)
        if "tok" in self.input_names:      # the combine after APPEND's partial: the token's summary, as the kernel's
            outs[1] = mx.any(inputs[self.input_names.index("tok")], axis=1, keepdims=True)
        return outs


@pytest.fixture
def gpu(monkeypatch, tune):
    log = []
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("cuda", "recorded launches"))
    monkeypatch.setattr(backend, "available", lambda: (True, "recorded launches"))
    monkeypatch.setattr(kernels, "available", lambda: (True, "recorded launches"))
    monkeypatch.setattr(backend, "cuda_kernel", lambda name, input_names, output_names, source, header="",
                        ensure_row_contiguous=True: _Recorder(log, name, input_names))
    monkeypatch.setattr(backend, "kernel", lambda kind, method, dtype_name: _Recorder(
        log, f"vq_{kind}", ["x"]))
    monkeypatch.setattr(katt, "_sm_count", lambda: 132)
    tune(fuse_append=False)     # the tests of the fused append turn it on
    # cached kernel objects (and launch parts holding them) made with the recorders: not kept. Every cache of
    # the modules that make launches, not a list of them: a recorder left in commit._kernel once made the next
    # GPU test's buffer growth store zeros (tests/test_append_kernel_gpu.py, turboquant pair, 2026-12-01)
    for f in _launch_caches():
        f.cache_clear()
    yield log
    for f in _launch_caches():
        f.cache_clear()
    km._RANGE.clear()
    gc.collect()
    left = [o for o in gc.get_objects() if type(o) is _Recorder]
    assert not left, f"{len(left)} recorded kernel(s) outlive the test (a cache the fixture does not clear)"


def _launch_caches():
    mods = (fused, katt, km, commit, backend, vattention, cache_base)
    return {id(f): f for m in mods for f in vars(m).values() if callable(getattr(f, "cache_clear", None))}.values()


def _x(seed, t=1, h=HKV, nan=False):
    a = np.random.default_rng(seed).standard_normal((B, h, t, D)).astype(np.float16)
    if nan:
        a[0, 0, 0, 3] = np.nan
    return mx.array(a)


def _layer(cache, i, nan=False):
    k, v = cache.update_and_fetch(_x(2 * i, nan=nan), _x(2 * i + 1))
    return base.scaled_dot_product_attention(_x(1000 + i, h=HQ), k, v, cache=cache, scale=D ** -0.5, mask=None)


def _general(monkeypatch):
    monkeypatch.setattr(decode_step.DecodeStep, "holds", lambda self, keys, values: False)


def _prefilled(m, general: bool):
    """A turboquant b4 cache after a 5-token prefill, on the general path if `general` (for context m)."""
    if general:
        _general(m)
    c = VeloxKVCache(method="turboquant", bits=4, layer=0, seed=3)
    c.update_and_fetch(_x(7, t=5), _x(8, t=5))
    return c


def _launches(log):
    return [c for c in log if c["name"].startswith(("vq_append", "vq_attention"))]


def _same(a, b, where):
    assert len(a) == len(b), f"{where}: {len(a)} launches against the general path's {len(b)}"
    for x, y in zip(a, b):
        for f in ("name", "template", "grid", "group", "shapes"):
            assert x[f] == y[f], f"{where}: {x['name']} {f} {x[f]} != {y[f]}"
        assert len(x["inputs"]) == len(y["inputs"]), f"{where}: {x['name']} input count"
        for j, (p, q) in enumerate(zip(x["inputs"], y["inputs"])):
            assert p.shape == q.shape and np.array_equal(p, q, equal_nan=True), \
                f"{where}: {x['name']} input {j} differs from the general path's"


def _run(monkeypatch, gpu, general: bool, tensor_cores: bool, steps=6, nan_at=None, trim_at=None, make=None):
    monkeypatch.setattr(katt, "_mma_available", lambda: tensor_cores)
    with monkeypatch.context() as m:
        if general:
            _general(m)
        c = (make or (lambda: VeloxKVCache(method="turboquant", bits=4, layer=0, seed=3)))()
        c.update_and_fetch(_x(7, t=5), _x(8, t=5))      # prefill (general path)
        gpu.clear()
        per_step, err = [], None
        for i in range(steps):
            if trim_at == i:
                c.trim(1)
            n0 = len(gpu)
            try:
                _layer(c, i, nan=(nan_at == i))
            except ValueError as e:
                err = (i, str(e), c.offset)
                break
            per_step.append((gpu[n0:], c.offset, c._k._q, c._v._q, len(c._chunks)))
        return per_step, err, c


@pytest.mark.parametrize("fused", [True, False], ids=["fused-combine", "combine-launch"])
@pytest.mark.parametrize("tensor_cores", [False, True])
def test_same_launches_and_state_as_the_general_path(monkeypatch, tune, gpu, tensor_cores, fused):
    tune(fuse_combine=fused)
    calls = []
    real = decode_step.DecodeStep.step

    def spy(self, keys, values):
        calls.append(1)
        return real(self, keys, values)
    monkeypatch.setattr(decode_step.DecodeStep, "step", spy)
    fast, _, cf = _run(monkeypatch, gpu, general=False, tensor_cores=tensor_cores)
    n_fast = len(calls)
    ref, _, cr = _run(monkeypatch, gpu, general=True, tensor_cores=tensor_cores)
    assert n_fast >= 4, f"DecodeStep.step ran {n_fast} times in 6 decode steps: the test does not reach it"
    for i, (a, b) in enumerate(zip(fast, ref)):
        assert a[1:] == b[1:], f"step {i}: (offset, key rows, value rows, chunks) {a[1:]} != {b[1:]}"
        _same(_launches(a[0]), _launches(b[0]), f"step {i}")
    assert [(r.n, r.lo) for r in cf._k._rows.values()] == [(r.n, r.lo) for r in cr._k._rows.values()]
    combines = [sum(x["name"] == "vq_attention_combine" for x in a[0]) for a in fast]
    assert combines == [0 if fused else 1] * len(fast), f"combine launches per step {combines} (fused={fused})"


def test_a_nan_chunk_is_rejected_and_rolled_back_like_the_general_path(monkeypatch, gpu):
    _, err_fast, cf = _run(monkeypatch, gpu, general=False, tensor_cores=False, nan_at=3)
    _, err_ref, cr = _run(monkeypatch, gpu, general=True, tensor_cores=False, nan_at=3)
    assert err_fast is not None and err_ref is not None, (err_fast, err_ref)
    assert err_fast == err_ref, f"DecodeStep: {err_fast}; general path: {err_ref}"
    assert "keys" in err_fast[1] and cf.offset == 5 + 3 == cr.offset
    assert cf._k._q == cf._v._q == 8, (cf._k._q, cf._v._q)
    # the cache goes on from the restored state
    _layer(cf, 10)
    assert cf.offset == 9


def test_a_trim_between_steps_leaves_the_step_and_comes_back(monkeypatch, gpu):
    fast, _, cf = _run(monkeypatch, gpu, general=False, tensor_cores=False, trim_at=3)
    ref, _, cr = _run(monkeypatch, gpu, general=True, tensor_cores=False, trim_at=3)
    for i, (a, b) in enumerate(zip(fast, ref)):
        assert a[1:] == b[1:], f"step {i}: {a[1:]} != {b[1:]}"
        _same(_launches(a[0]), _launches(b[0]), f"step {i}")


def test_step_kv_record_is_the_state_of_its_step(monkeypatch, gpu):
    monkeypatch.setattr(katt, "_mma_available", lambda: False)
    c = VeloxKVCache(method="turboquant", bits=4, layer=0, seed=3)
    c.update_and_fetch(_x(7, t=5), _x(8, t=5))
    c.update_and_fetch(_x(1), _x(2))
    k, v = c.update_and_fetch(_x(3), _x(4))
    assert isinstance(k, vattention.StepKV), type(k)
    c.update_and_fetch(_x(5), _x(6))                  # a later append must not change k's record
    rec = k.record
    assert rec.encoded == 7 and k.shape == (B, HKV, 7, D) and rec.token is k.flags
    assert all(f.shape[2] == 7 for f in rec.fields.values())


@pytest.mark.skipif(not kernels.available()[0], reason=f"needs the GPU kernels: {kernels.available()[1]}")
@pytest.mark.parametrize("fuse_append", [False, True], ids=["append-launch", "append-inside"])
@pytest.mark.parametrize("method, kw", [("turboquant", dict(bits=4)), ("rabitq", {}),
                                        ("turboquant_prod", dict(bits=4)), ("mlx_affine", dict(bits=4, group_size=64)),
                                        ("turboquant", dict(bits=3))])
@pytest.mark.parametrize("window", [0, 32], ids=["w0", "w32"])
@pytest.mark.parametrize("whole", [False, True], ids=["views", "whole-windows"])
def test_gpu_decode_step_matches_the_general_path_bit_for_bit(monkeypatch, tune, method, kw, fuse_append, window,
                                                             whole):
    """Same kernels, same inputs: the attention outputs and the stored bytes are identical to the general
    path's, step by step (on the GPU: the launches as compiled). With the append inside the partial launch
    (fuse_append) the stored bytes are identical and the outputs agree within the attention tolerance (one split
    more: another summation order). turboquant b3 with tuning's tc_3bit: its tensor-core loop (csrc/tc_tens_*.cuh).
    `whole`: tuning's whole_windows (the window buffers whole: csrc/window_bind.h; window 32 only)."""
    if whole and not window:
        pytest.skip("no window: whole_windows changes nothing")
    tune(fuse_append=fuse_append, tc_3bit=True, whole_windows=whole)

    def run(general):
        with monkeypatch.context() as m:
            if general:
                _general(m)
            c = VeloxKVCache(method=method, layer=1, seed=5, window=window, **kw)
            c.update_and_fetch(_x(7, t=300), _x(8, t=300))
            outs = [np.array(_layer(c, i)) for i in range(5)]
            used = c._fast is not None
            return outs, [np.array(a) for rec in c.state[:2] for _, a in sorted(rec.items())], used
    fo, fs, used = run(False)
    go, gs, _ = run(True)
    assert used, "the decode step path was not taken"
    for i, (a, b) in enumerate(zip(fo, go)):
        if fuse_append:
            np.testing.assert_allclose(a, b, rtol=0, atol=4e-3 * np.abs(b).max(), err_msg=f"{method}: step {i}")
        else:
            assert np.array_equal(a, b), f"{method}: step {i} attention output differs from the general path's"
    for a, b in zip(fs, gs):
        assert np.array_equal(a, b), f"{method}: stored state differs from the general path's"


MIXED = [   # different key and value methods / windows in one layer (kernels/append.py mixed)
    ("tq3-kivi2", dict(key_method="turboquant", key_bits=3, value_method="kivi", value_bits=2)),   # R = 0 / 128
    ("tq3-kivi2-w32", dict(key_method="turboquant", key_bits=3, value_method="kivi", value_bits=2, window=32)),
    ("kivi4-tq4", dict(key_method="kivi", key_bits=4, value_method="turboquant", value_bits=4)),   # values ahead
    # keys turboquant 4-bit with a window of 32 beside rabitq values without one (the cache takes one window for both
    # roles: the values' parameters are set before its first append; split S - 1 rotates the exact keys)
    ("tq4w32-rabitq", None),
]


def _mixed_cache(kw):
    if kw is not None:
        return VeloxKVCache(layer=1, seed=5, **kw)
    c = VeloxKVCache(key_method="turboquant", key_bits=4, value_method="rabitq", layer=1, seed=5, window=32)
    c.value_params = dataclasses.replace(c.value_params, window=0)
    return c


@pytest.mark.skipif(not kernels.available()[0], reason=f"needs the GPU kernels: {kernels.available()[1]}")
@pytest.mark.parametrize("fuse_append", [False, True], ids=["append-launch", "append-inside"])
@pytest.mark.parametrize("name, kw", MIXED, ids=[m[0] for m in MIXED])
@pytest.mark.parametrize("whole", [False, True], ids=["views", "whole-windows"])
def test_gpu_mixed_decode_step_matches_the_general_path(monkeypatch, tune, name, kw, fuse_append, whole):
    """Keys and values of different methods or windows (the recommended keys turboquant 3-bit + values KIVI 2-bit)
    on the GPU: 200 decode steps after a 300-token prefill (several KIVI flushes) through the DecodeStep's MIXED
    launches (the roles' encoded counts differ) against the general path (accelerated.attention.aligned): every step
    took the DecodeStep's attention launch but those that make a new in-place plan (after the prefill, when a role's
    buffers grow), the stored bytes are identical, the outputs within the attention
    tolerance (other splits: another summation order). `whole`: tuning's whole_windows (csrc/window_bind.h)."""
    tune(fuse_append=fuse_append, whole_windows=whole)
    attended = []
    real = decode_step.DecodeStep.attend
    monkeypatch.setattr(decode_step.DecodeStep, "attend",
                        lambda self, *a, **k: (lambda out: attended.append(out is not None) or out)(real(self, *a, **k)))

    def run(general):
        with monkeypatch.context() as m:
            if general:
                _general(m)
            c = _mixed_cache(kw)
            c.update_and_fetch(_x(7, t=300), _x(8, t=300))
            outs, skipped = [], []
            for i in range(200):
                n, plan = len(attended), c._in_place
                outs.append(np.array(_layer(c, i).astype(mx.float32)))
                if len(attended) == n:
                    skipped.append((i, c._in_place is not plan))
            return outs, [np.array(a) for rec in c.state[:2] for _, a in sorted(rec.items())], c, skipped
    fo, fs, fc, skipped = run(False)
    fast = list(attended)
    go, gs, _, _ = run(True)
    assert fc._fast is not None and fc._fast.mixed, f"{name}: not a MIXED DecodeStep"
    assert all(fast), f"{name}: the DecodeStep refused {fast.count(False)} of its {len(fast)} attention calls"
    # a step leaves the DecodeStep only where it makes a new in-place plan: the first step after the prefill and the
    # steps where a role's buffers grow (new buffers, then the plan for them), as for a single method
    assert all(new for _, new in skipped) and len(skipped) <= 3, \
        f"{name}: steps (index, new plan) that took the general path: {skipped}"
    assert fc._k._q != fc._v._q, f"{name}: the roles' encoded counts should differ"
    for i, (a, b) in enumerate(zip(fo, go)):
        np.testing.assert_allclose(a, b, rtol=0, atol=4e-3 * np.abs(b).max(), err_msg=f"{name}: step {i}")
    for a, b in zip(fs, gs):
        assert np.array_equal(a, b), f"{name}: stored state differs from the general path's"


@pytest.mark.parametrize("fuse_append", [False, True], ids=["append-launch", "append-inside"])
def test_a_sliding_window_cache_stays_on_the_step_when_it_evicts(monkeypatch, tune, gpu, fuse_append):
    """VeloxRotatingKVCache evicts before it appends once full: the rows are only skipped (lo), so the step goes on,
    appending at buffer row lo + Q (the general path's bytes: the same append launch, the same state) and attending
    over the whole buffers from row lo (a RowStarts of lo). A compaction (new buffers) takes the general path once,
    then the step comes back."""
    monkeypatch.setattr(katt, "_mma_available", lambda: False)
    tune(fuse_append=fuse_append)
    tune(compact_rows=4)
    ran = []
    real = decode_step.DecodeStep.step
    monkeypatch.setattr(decode_step.DecodeStep, "step", lambda self, k, v: ran.append(len(ran)) or real(self, k, v))

    def run(general):
        with monkeypatch.context() as m:
            if general:
                _general(m)
            c = VeloxRotatingKVCache(8, method="turboquant", bits=4, layer=0, seed=3)
            c.update_and_fetch(_x(7, t=5), _x(8, t=5))
            steps = []
            for i in range(16):
                gpu.clear()
                ran.clear()
                _layer(c, i)
                rows = [(r.n, r.lo) for s in (c._k, c._v) for r in s._rows.values()]
                steps.append((gpu[:], bool(ran), (c.offset, c._k._q, c._v._q, len(c._chunks), rows)))
            return steps
    fast, ref = run(False), run(True)
    on_step = 0
    for i, ((fl, took, fs), (gl, _, gs)) in enumerate(zip(fast, ref)):
        assert fs == gs, f"step {i}: (offset, key rows, value rows, chunks, (n, lo) per field) {fs} != {gs}"
        lo, q = fs[4][0][1], fs[1]
        for launches in (fl, gl):     # each path's append writes the row past the valid ones (now n - 1)
            for a in _by_name(_launches(launches), "vq_append"):
                assert int(a["inputs"][0][0]) == fs[4][0][0] - 1, f"step {i}: append at row {a['inputs'][0]}"
        if not took:
            continue
        on_step += 1
        appends = _by_name(_launches(fl), "vq_append")
        if not fuse_append:
            _same(appends, _by_name(_launches(gl), "vq_append"), f"step {i}: the append")
        (part,) = _by_name(_launches(fl), "vq_attention_partial")
        ins = dict(zip(part["names"], part["inputs"]))
        assert int(ins["nenc"][0]) == lo + q, f"step {i}: the launch attends up to row {ins['nenc']}, not {lo + q}"
        if lo:
            assert part["name"].endswith("r") and int(ins["rstart"][0]) == lo, f"step {i}: rows from {lo} not skipped"
    assert on_step >= 13, f"the decode step ran in {on_step} of 16 steps"
    assert any(g[2][4][0][1] == 0 and i > 5 for i, g in enumerate(fast)), "no compaction in the run"


@pytest.mark.parametrize("fuse_append", [False, True], ids=["append-launch", "append-inside"])
def test_a_windowed_sliding_window_cache_stays_on_the_step_when_it_evicts(monkeypatch, tune, gpu, fuse_append):
    """With an exact window, a full sliding-window cache evicts only encoded rows each step (the window keeps its
    newest R tokens): the window stays the buffer's view, so the plan holds (InPlace.evicted) and the step goes on;
    the same rows, counts and windows as the general path's."""
    monkeypatch.setattr(katt, "_mma_available", lambda: False)
    tune(fuse_append=fuse_append)
    ran = []
    real = decode_step.DecodeStep.step
    monkeypatch.setattr(decode_step.DecodeStep, "step", lambda self, k, v: ran.append(1) or real(self, k, v))

    def run(general):
        with monkeypatch.context() as m:
            if general:
                _general(m)
            c = VeloxRotatingKVCache(16, method="turboquant", bits=4, layer=0, seed=3, window=4)
            c.update_and_fetch(_x(7, t=5), _x(8, t=5))
            ran.clear()
            steps = []
            for i in range(30):
                _layer(c, i)
                rows = [(r.n, r.lo) for s in (c._k, c._v) for r in s._rows.values()]
                steps.append((c.offset, c._k._q, c._v._q, c._k._window.shape, rows))
            return steps, len(ran)
    (fast, on_step), (ref, _) = run(False), run(True)
    assert fast == ref, "(offset, key rows, value rows, window shape, rows) differ from the general path's"
    assert on_step >= 29, f"the decode step ran in {on_step} of 30 steps (each eviction made a new plan)"


def test_a_sliding_window_cache_counts_the_chunk_its_step_left_pending(monkeypatch, tune, gpu):
    """With the append left for the attention launch (fuse_append), the cache's own reads of what it holds (the
    held count, make_mask, size) see the chunk before any attention: mlx-lm's RotatingKVCache fed the same chunks
    (prefill, one-token steps past max_size, a multi-token chunk) holds and masks the same. The step stays in use."""
    from mlx_lm.models.cache import RotatingKVCache
    monkeypatch.setattr(katt, "_mma_available", lambda: False)
    tune(fuse_append=True)
    c, ref = VeloxRotatingKVCache(8, method="turboquant", bits=4, layer=0, seed=3), RotatingKVCache(8)
    pending = 0
    for i, t in enumerate([3] + [1] * 9 + [3] + [1] * 3):
        k, v = _x(2 * i, t=t), _x(2 * i + 1, t=t)
        c.update_and_fetch(k, v)
        ref.update_and_fetch(k, v)
        pending += c._fast is not None and c._fast.pending is not None
        held = min(ref.offset, ref.keys.shape[2])
        masks = [(c.make_mask(n), ref.make_mask(n, window_size=8)) for n in (1, 2, 3)]
        assert c._held() == held and c.size() == ref.size() and c.offset == ref.offset, (i, c._held(), held)
        for n, (a, b) in enumerate(masks, 1):
            assert (a is None and b is None) or (isinstance(a, str) and a == b) or \
                (isinstance(a, mx.array) and isinstance(b, mx.array) and a.shape == b.shape and bool(mx.all(a == b))), \
                f"step {i}: make_mask({n}) {a} != mlx-lm's {b}"
    assert pending >= 10, f"an append was pending after {pending} updates: the test does not reach that state"


def test_a_nan_chunk_in_a_sliding_window_cache_is_rolled_back_like_the_general_path(monkeypatch, gpu):
    """A fault found while the step runs past evictions (rows from lo): the same rejection, offset and rows (lo
    included) as the general path, and the cache goes on."""
    make = lambda: VeloxRotatingKVCache(6, method="turboquant", bits=4, layer=0, seed=3)   # noqa: E731
    ran, real = [], decode_step.DecodeStep.step
    with monkeypatch.context() as m:
        m.setattr(decode_step.DecodeStep, "step", lambda self, k, v: ran.append(1) or real(self, k, v))
        _, err_fast, cf = _run(monkeypatch, gpu, general=False, tensor_cores=False, steps=9, nan_at=6, make=make)
    assert len(ran) >= 5, f"the decode step ran {len(ran)} times: the test does not reach it"
    _, err_ref, cr = _run(monkeypatch, gpu, general=True, tensor_cores=False, steps=9, nan_at=6, make=make)
    assert err_fast is not None and err_fast == err_ref, (err_fast, err_ref)
    rows = lambda c: [(r.n, r.lo) for s in (c._k, c._v) for r in s._rows.values()]   # noqa: E731
    assert rows(cf) == rows(cr) and any(lo for _, lo in rows(cf)), (rows(cf), rows(cr))
    _layer(cf, 10)
    _layer(cr, 10)
    assert cf.offset == cr.offset and rows(cf) == rows(cr)


def test_a_copied_cache_appends_into_its_own_buffers(monkeypatch, gpu):
    """mlx-lm deep-copies prompt caches: the copy must not keep the original's decode step (which writes into
    the original's buffers)."""
    monkeypatch.setattr(katt, "_mma_available", lambda: False)
    c = VeloxKVCache(method="turboquant", bits=4, layer=0, seed=3)
    c.update_and_fetch(_x(7, t=5), _x(8, t=5))
    for i in range(3):
        _layer(c, i)
    assert c._fast is not None
    d = copy.deepcopy(c)
    assert d._fast is None and d._in_place is None
    gpu.clear()
    _layer(d, 5)
    _layer(d, 6)
    appends = [x for x in gpu if x["name"].startswith("vq_append")]
    own = {id(r.buf) for r in d._k._rows.values()} | {id(r.buf) for r in d._v._rows.values()}
    theirs = {id(r.buf) for r in c._k._rows.values()} | {id(r.buf) for r in c._v._rows.values()}
    assert appends and all(not (set(x["ids"]) & theirs) for x in appends), "the copy wrote into the original's buffers"
    assert all(set(x["ids"]) & own for x in appends)
    assert d._fast is not None and d._fast.k is d._k


@pytest.mark.parametrize("fuse_append", [False, True], ids=["append-launch", "append-inside"])
def test_an_older_steps_keys_attend_over_that_steps_state(monkeypatch, tune, gpu, fuse_append):
    """Keys/values kept from an earlier step and attended after a later append read what that step stored (its
    encoded count and token), as the general path's record does. With the append inside the partial launch the
    older step's append was launched alone by the later update (its StepKV holds the resolved _Pending)."""
    monkeypatch.setattr(katt, "_mma_available", lambda: False)
    tune(fuse_append=fuse_append)

    def run(general):
        with monkeypatch.context() as m:
            c = _prefilled(m, general)
            c.update_and_fetch(_x(1), _x(2))
            c.update_and_fetch(_x(3), _x(4))
            k, v = c.update_and_fetch(_x(5), _x(6))         # offset 8
            c.update_and_fetch(_x(9), _x(10))               # a later append (offset 9)
            gpu.clear()
            base.scaled_dot_product_attention(_x(1000, h=HQ), k, v, cache=c, scale=D ** -0.5, mask=None)
            return _launches(gpu), k
    (fast, k), (ref, _) = run(False), run(True)
    _same(fast, ref, "attention over an older step's keys")
    names = katt.src.inputs("partial", 0, 0, False, True)
    assert int(fast[0]["inputs"][names.index("nenc")][0]) == 8, "the launch read the later append's count"
    assert fast[0]["ids"][names.index("flags")] == id(k.flags), "the launch waits on another append's token"


def test_specialize_rows_reaches_the_steps_append_per_cache(monkeypatch, tune, gpu):
    """tuning's specialize_rows (a benchmark arm's knob) decides each cache's append template when its step is
    made, even in one process with the launch plans of the other setting cached (they are keyed by it)."""
    monkeypatch.setattr(katt, "_mma_available", lambda: False)
    templates, default = {}, tuning.current().specialize_rows
    for rows in (default, 0):
        tune(specialize_rows=rows)
        c = VeloxKVCache(method="turboquant", bits=4, layer=0, seed=3)
        c.update_and_fetch(_x(7, t=5), _x(8, t=5))
        gpu.clear()
        for i in range(3):
            _layer(c, i)
        templates[rows] = [dict(x["template"]) for x in gpu if x["name"].startswith("vq_append")]
    generic, special = templates[default], templates[0]
    assert len(generic) == len(special) == 3, templates
    assert all(t["KB1"] == 0 for t in generic), f"a 16-row append compiled its code widths in: {generic}"
    assert all(t["KB1"] == 4 for t in special), f"specialize_rows=0 did not reach the step's append: {special}"


def _by_name(launches, prefix):
    return [x for x in launches if x["name"].startswith(prefix)]


def _fused_steps(fast, ref):
    """(step, fast launches, general launches) of each step the fast path fused: every step keeps the general path's
    state, and a step that still made the plan (an append launched) launches what the general path launches."""
    for i, (a, b) in enumerate(zip(fast, ref)):
        assert a[1:] == b[1:], f"step {i}: (offset, key rows, value rows, chunks) {a[1:]} != {b[1:]}"
        la, lb = _launches(a[0]), _launches(b[0])
        if _by_name(la, "vq_append"):            # the first steps make the plan on the general path
            _same(la, lb, f"step {i}")
            continue
        yield i, la, lb


@pytest.mark.parametrize("tensor_cores", [False, True])
def test_fused_append_is_the_general_paths_append_inside_the_partial_launch(monkeypatch, tune, gpu, tensor_cores):
    """tuning's fuse_append: each step makes two launches (the partial with APPEND, the combine) where the
    general path makes three, with the append's inputs (new keys and values, constant arrays, the encoded count
    after the chunk) and the same state after every step (offset, rows, deferred-check records)."""
    tune(fuse_append=True)
    settles, real = [], VeloxKVCache._settle
    monkeypatch.setattr(VeloxKVCache, "_settle", lambda self, keep: settles.append(keep) or real(self, keep))
    fast, _, cf = _run(monkeypatch, gpu, general=False, tensor_cores=tensor_cores)
    # clean tokens are passed by DecodeStep's one comparison: the general _settle (a Python loop over the
    # messages, ~10 us on the H200's host) runs only while the step is made
    assert len(settles) <= 3, f"_settle ran {len(settles)} times in 6 steps"
    ref, _, cr = _run(monkeypatch, gpu, general=True, tensor_cores=tensor_cores)
    assert len(fast) == len(ref) == 6
    fused_steps = 0
    for i, la, lb in _fused_steps(fast, ref):
        fused_steps += 1
        assert [x["name"].split("_")[2] for x in la] == ["partial", "combine"], [x["name"] for x in la]
        p, app, pr = la[0], _by_name(lb, "vq_append")[0], _by_name(lb, "vq_attention_partial")[0]
        tmpl = dict(p["template"])
        assert tmpl["APPEND"] == 1 and dict(pr["template"])["APPEND"] == 0, (p["template"], pr["template"])
        names = katt.src.inputs("partial", 0, 0, False, False, True)
        anames = fused.inputs("turboquant", "turboquant")
        for mine, theirs in (("kx", "kx"), ("vx", "vx"), ("kconst", "kconst"), ("vconst", "vconst")):
            assert np.array_equal(p["inputs"][names.index(mine)], app["inputs"][anames.index(theirs)]), \
                f"step {i}: APPEND's {mine} is not the append launch's {theirs}"
        pnames = katt.src.inputs("partial", 0, 0, False, False)
        assert int(p["inputs"][names.index("nenc")][0]) == int(pr["inputs"][pnames.index("nenc")][0])
        assert p["shapes"][2] == (2, B * HKV, 2), p["shapes"]
    assert fused_steps >= 4, f"{fused_steps} of 6 steps took the fused append"
    assert [(r.n, r.lo) for r in cf._k._rows.values()] == [(r.n, r.lo) for r in cr._k._rows.values()]


def test_fused_append_rejects_a_nan_chunk_like_the_general_path(monkeypatch, tune, gpu):
    tune(fuse_append=True)
    _, err_fast, cf = _run(monkeypatch, gpu, general=False, tensor_cores=True, nan_at=3)
    _, err_ref, cr = _run(monkeypatch, gpu, general=True, tensor_cores=True, nan_at=3)
    assert err_fast is not None and err_fast == err_ref, (err_fast, err_ref)
    assert cf._k._q == cf._v._q == cr._k._q == 8, (cf._k._q, cr._k._q)
    _layer(cf, 10)
    assert cf.offset == 9


@pytest.mark.parametrize("reader", ["check", "update", "record", "flags", "copy", "trim", "state", "nbytes"])
def test_a_pending_append_is_stored_before_anything_reads_the_cache(monkeypatch, tune, gpu, reader):
    """Between update_and_fetch and the attention the chunk waits for the partial launch (fuse_append); every other
    reader launches the append on its own first and sees the state the general path leaves."""
    tune(fuse_append=True)
    monkeypatch.setattr(katt, "_mma_available", lambda: False)

    def run(general):
        with monkeypatch.context() as m:
            c = _prefilled(m, general)
            for i in range(3):
                _layer(c, i)
            gpu.clear()
            k, v = c.update_and_fetch(_x(20), _x(21))
            if not general:
                assert c._fast is not None and c._fast.pending is not None, "the step did not leave its append pending"
                assert not _by_name(gpu, "vq_append"), "the append launched before anything read the cache"
            out = {"check": lambda: c.check(), "update": lambda: c.update_and_fetch(_x(22), _x(23)),
                   "record": lambda: k.record.encoded, "flags": lambda: k.flags.shape,
                   "copy": lambda: copy.deepcopy(c), "trim": lambda: c.trim(1), "state": lambda: c.state[2],
                   "nbytes": lambda: c.nbytes}[reader]()
            c.check()
            target = out if reader == "copy" else c
            return (target.offset, target._k._q, target._v._q, [ch.index for ch in target._chunks],
                    len(_by_name(gpu, "vq_append")))
    got, want = run(False), run(True)
    assert got[-1] >= 1, f"{reader}: the pending append was not launched"
    assert got[:4] == want[:4], f"{reader}: (offset, key rows, value rows, chunks) {got[:4]} != general path {want[:4]}"


def test_metal_launches_the_append_alone(monkeypatch, tune, gpu):
    """fuse_append applies on CUDA only (kernels.attention.fuse_append: measured and run on the H200, never on an
    Apple GPU): with Metal's kernels (recorded) each step launches the append kernel, then the partial (no APPEND)
    and the combine, as the general path does."""
    tune(fuse_append=True)
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("metal", "recorded launches"))
    monkeypatch.setattr(mx.fast, "metal_kernel", lambda name, input_names, output_names, source, header="",
                        ensure_row_contiguous=True, **kw: _Recorder(gpu, name, input_names))
    fast, _, _ = _run(monkeypatch, gpu, general=False, tensor_cores=False)
    ref, _, _ = _run(monkeypatch, gpu, general=True, tensor_cores=False)
    assert len(fast) == len(ref) == 6
    for i, (a, b) in enumerate(zip(fast, ref)):
        la = _launches(a[0])
        assert [x["name"].split("_")[1] for x in la] == ["append", "attention", "attention"], [x["name"] for x in la]
        assert all(dict(x["template"]).get("APPEND", 0) == 0 for x in la), f"step {i}: an APPEND launch on Metal"
        _same(la, _launches(b[0]), f"step {i}")


def _run_heads(monkeypatch, gpu, general: bool, h: int, steps=6, nan_at=None, hq=None):
    """_run for a cache of h KV heads (and hq query heads, h by default): (per step (launches, the latest record's
    flags shape), the error, the cache)."""
    hq = hq or h
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    with monkeypatch.context() as m:
        if general:
            _general(m)
        c = VeloxKVCache(method="turboquant", bits=4, layer=0, seed=3)
        c.update_and_fetch(_x(7, t=5, h=h), _x(8, t=5, h=h))
        gpu.clear()
        per_step, err = [], None
        for i in range(steps):
            n0 = len(gpu)
            try:
                k, v = c.update_and_fetch(_x(2 * i, h=h, nan=(nan_at == i)), _x(2 * i + 1, h=h))
                base.scaled_dot_product_attention(_x(1000 + i, h=hq), k, v, cache=c, scale=D ** -0.5, mask=None)
            except ValueError as e:
                err = (i, str(e), c.offset)
                break
            per_step.append((gpu[n0:], tuple(c._chunks[-1].flags.shape)))
        return per_step, err, c


@pytest.mark.parametrize("fuse_append, hq", [(False, 24), (True, 192)], ids=["append-launch", "append-refused"])
def test_a_token_over_8_bytes_is_read_through_the_combines_summary(monkeypatch, tune, gpu, fuse_append, hq):
    """The append launched alone for 24 KV heads: 24 rows in three threadgroups, a token of (2, 3, 2) = 12 bytes,
    which MLX's CUDA allocator keeps in device memory (a host read of it stalls the GPU later:
    attention_source.COMBINE_SUMMARY). Launched alone with fuse_append off, or with it on where the partial refuses
    the append inside (8 query heads per KV head: two query groups on the tensor-core loop), then flushed. The combine
    launch takes the token and writes its summary; the step's record holds the summary, not the token; a NaN chunk is
    rejected and rolled back as on the general path."""
    tune(fuse_append=fuse_append)
    fast, _, _ = _run_heads(monkeypatch, gpu, general=False, h=24, hq=hq)
    summarized = 0
    for i, (launches, shape) in enumerate(fast):
        la = _launches(launches)
        comb = _by_name(la, "vq_attention_combine")
        app = _by_name(la, "vq_append")
        assert len(comb) == 1 and len(app) == 1, [x["name"] for x in la]
        if comb[0]["name"].endswith("_a"):
            summarized += 1
            assert comb[0]["inputs"][-1].shape == (2, 3, 2), comb[0]["inputs"][-1].shape
            assert comb[0]["shapes"][1] == (2, 1, 2) and shape == (2, 1, 2), (comb[0]["shapes"], shape)
    assert summarized >= 4, f"{summarized} of 6 steps read the combine's summary"
    _, err_fast, cf = _run_heads(monkeypatch, gpu, general=False, h=24, nan_at=3, hq=hq)
    _, err_ref, cr = _run_heads(monkeypatch, gpu, general=True, h=24, nan_at=3, hq=hq)
    assert err_fast is not None and err_fast == err_ref, (err_fast, err_ref)
    assert cf.offset == cr.offset and cf._k._q == cr._k._q, (cf.offset, cr.offset)


@pytest.mark.skipif(not kernels.available()[0], reason=f"needs the GPU kernels: {kernels.available()[1]}")
@pytest.mark.parametrize("fuse_append, hq", [(False, 24), (True, 192)], ids=["append-launch", "append-refused"])
def test_gpu_token_over_8_bytes_read_through_the_summary(monkeypatch, tune, fuse_append, hq):
    """On the GPU (the launches as compiled): 24 KV heads, the append launched alone (fuse_append off, or refused
    inside the partial with 8 query heads per KV head), its token (2, 3, 2) summarized by the combine. Outputs and
    stored bytes identical to the general path's, the records hold the 4-byte summary, and a NaN key in head 17 is
    rejected and rolled back as on the general path."""
    tune(fuse_append=fuse_append)
    h = 24

    def run(general, nan_at=None):
        with monkeypatch.context() as m:
            if general:
                _general(m)
            c = VeloxKVCache(method="turboquant", bits=4, layer=1, seed=5)
            c.update_and_fetch(_x(7, t=300, h=h), _x(8, t=300, h=h))
            outs, shapes, err = [], [], None
            for i in range(5):
                k = _x(2 * i, h=h)
                if nan_at == i:
                    a = np.array(k)
                    a[0, 17, 0, 3] = np.nan
                    k = mx.array(a)
                try:
                    kk, vv = c.update_and_fetch(k, _x(2 * i + 1, h=h))
                    o = base.scaled_dot_product_attention(_x(1000 + i, h=hq), kk, vv, cache=c, scale=D ** -0.5,
                                                          mask=None)
                    outs.append(np.array(o))
                    shapes.append(tuple(c._chunks[-1].flags.shape))
                except ValueError as e:
                    err = (i, str(e), c.offset)
                    break
            state = [np.array(a) for rec in c.state[:2] for _, a in sorted(rec.items())]
            return outs, state, shapes, err, c._fast is not None
    fo, fs, fshapes, _, used = run(False)
    go, gs, _, _, _ = run(True)
    assert used, "the decode step path was not taken"
    assert fshapes[-1] == (2, 1, 2), f"the step's record holds {fshapes[-1]}, not the combine's summary"
    for i, (a, b) in enumerate(zip(fo, go)):
        assert np.array_equal(a, b), f"step {i}: attention output differs from the general path's"
    for a, b in zip(fs, gs):
        assert np.array_equal(a, b), "stored state differs from the general path's"
    *_, ef, _ = run(False, nan_at=2)
    *_, eg, _ = run(True, nan_at=2)
    assert ef is not None and ef == eg, (ef, eg)


def test_a_left_padded_batch_takes_one_decode_step_launch_per_layer(monkeypatch, tune, gpu):
    """SharedBatchVeloxKVCache (accelerated/cache/batch_shared.py): a batch of 3 sequences of different lengths
    takes the decode step's launch: per step one partial (the append inside) and one combine for the whole batch,
    the partial given each row's start (rstart: the left padding) through the model's mask, with the launch the
    general path makes for the same records and RowStarts (same template, grid and inputs)."""
    from veloxquant.accelerated.cache import SharedBatchVeloxKVCache
    from veloxquant.accelerated.ops.attention import RowStarts
    monkeypatch.setattr(katt, "_mma_available", lambda: False)
    tune(fuse_append=True)
    singles = []
    for i, t in enumerate((9, 4, 6)):
        c = VeloxKVCache(method="turboquant", bits=4, window=0, layer=0, seed=3)
        c.update_and_fetch(_x(20 + i, t=t), _x(30 + i, t=t))
        singles.append(c)
    batch = VeloxKVCache.merge(singles)
    assert isinstance(batch, SharedBatchVeloxKVCache) and batch.left_padding.tolist() == [0, 5, 3]
    bx = lambda s, h=HKV: mx.concatenate([_x(s + j, h=h) for j in range(3)])      # noqa: E731
    for step in range(4):
        gpu.clear()
        mask = batch.make_mask(1)
        k, v = batch.update_and_fetch(bx(100 + 10 * step), bx(200 + 10 * step))
        out = base.scaled_dot_product_attention(bx(300 + 10 * step, h=HQ), k, v, cache=batch, scale=D ** -0.5,
                                                mask=mask)
        mx.eval(out)
    assert batch.inner._fast is not None, "the decode step path was not taken"
    names = [c["name"] for c in _launches(gpu)]
    assert len(names) == 2 and names[0].startswith("vq_attention_partial") and names[0].endswith("ar"), names
    part = _launches(gpu)[0]
    assert part["grid"][2] == 3, part["grid"]                      # one launch for the three rows
    assert part["inputs"][part["names"].index("rstart")].tolist() == [0, 5, 3]
    # the general path's launch for the same records and row starts
    rec_k, rec_v = k.record, v.record
    gpu.clear()
    plan = katt.launch_plan(bx(300 + 30, h=HQ), rec_k, rec_v, D ** -0.5, RowStarts(batch.starts))
    assert plan.key[7] and "rstart" in plan.partial_names
    assert dict(plan.partial_template)["APPEND"] == 0 and part["grid"][1:] == plan.partial_grid[1:]


@pytest.mark.skipif(not kernels.available()[0], reason=f"needs the GPU kernels: {kernels.available()[1]}")
@pytest.mark.parametrize("method, kw", [("turboquant", dict(bits=4)), ("rabitq", {}), ("mlx_affine", dict(bits=4))])
def test_gpu_left_padded_batch_decode_step(monkeypatch, method, kw):
    """A SharedBatchVeloxKVCache of 3 sequences (300, 41 and 170 tokens) through the decode step's launch on the GPU
    (the append inside, row starts): each row's output within the attention tolerance of float64 attention over
    that row's own decoded tokens, and the stored bytes those of each sequence's own cache. (Not the ops path as
    the reference: on CUDA MLX computes float32 matmuls in TF32 unless MLX_ENABLE_TF32=0, ~1e-3 relative; the
    first version of this test failed on the H200 for that reason.)"""
    from _attention_util import f64_attention

    from veloxquant.accelerated.cache import SharedBatchVeloxKVCache

    def single(i, t):
        c = VeloxKVCache(method=method, window=0, layer=1, seed=5, **kw)
        c.update_and_fetch(_x(40 + i, t=t), _x(50 + i, t=t))
        return c
    lengths = (300, 41, 170)
    batch = VeloxKVCache.merge([single(i, t) for i, t in enumerate(lengths)])
    singles = [single(i, t) for i, t in enumerate(lengths)]
    assert isinstance(batch, SharedBatchVeloxKVCache)
    for step in range(5):
        ks, vs, qs = ([_x(1000 * r + 10 * step + j, h=h) for j in range(3)] for r, h in ((1, HKV), (2, HKV), (3, HQ)))
        mask = batch.make_mask(1)
        k, v = batch.update_and_fetch(mx.concatenate(ks), mx.concatenate(vs))
        q = mx.concatenate(qs).astype(mx.float32)
        got = np.array(base.scaled_dot_product_attention(q, k, v, cache=batch, scale=D ** -0.5, mask=mask))
        qf, kd, vd = np.array(q), np.array(k.record.dequantized()), np.array(v.record.dequantized())   # float32
        want = np.concatenate([f64_attention(qf[i:i + 1], kd[i:i + 1, :, s0:], vd[i:i + 1, :, s0:], D ** -0.5, False)
                               for i, s0 in enumerate(batch.starts.tolist())])
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max(), err_msg=f"step {step}")
        for c, a, b in zip(singles, ks, vs):
            c.update_and_fetch(a, b)
    assert batch.inner._fast is not None, "the decode step path was not taken"
    for i, c in enumerate(singles):
        got = [np.array(a) for rec in batch.extract(i).state[:2] for _, a in sorted(rec.items())]
        want = [np.array(a) for rec in c.state[:2] for _, a in sorted(rec.items())]
        assert all(np.array_equal(a, b) for a, b in zip(got, want)), f"{method}: sequence {i} bytes differ"


@pytest.mark.parametrize("tps, ls", [(256, 1024), (8, 1024), (64, 300), (1000, 256)])
def test_a_steps_split_counts_hold_over_the_range_it_keeps(tps, ls):
    """decode_step._splits: kattention.split_counts(q) for every count in the range (lo, hi] the step keeps them for,
    q inside it, across the scalar loop's change at 8192 (the step asks again only outside the range)."""
    rng = np.random.default_rng(7)
    with tuning.override(tokens_per_split=tps, long_split=ls) as t:
        for q in [*range(1, 600), *range(8000, 8400), *rng.integers(1, 300_000, 400).tolist()]:
            _, lo, hi, counts = decode_step._splits(q, t)
            assert lo < q <= hi, f"_splits({q}): range ({lo}, {hi}]"
            for x in {lo + 1, hi, (lo + hi + 1) // 2, q}:
                assert katt.split_counts(x) == counts, \
                    f"_splits({q}) kept {counts} for ({lo}, {hi}], but {x} has {katt.split_counts(x)} " \
                    f"(tokens_per_split {tps}, long_split {ls})"
