"""A ragged KIVI batch's rows (accelerated/cache/ragged.py: each row's key groups from its own phase) on the partial
kernel's KIVI tensor-core loop (tuning's tc_ragged; csrc/tc_kivi_*.cuh under VQ_RAGGED: a threadgroup's tokens are
one row's, its 16-token chunks start at the row's phase mod 16 and a chunk's key group is (t - phase) / G), run by
the kernel bodies on the CPU (tests/test_attention_kernels_emulated.py's emulator).

The records are the ragged B-row cache's own (merge of single caches of lengths differing mod G, then decode steps
crossing every row's flush), every byte a row must not read poisoned (tests/test_batch_ragged_kivi_kernels_emulated):
per row, the output is within conformance's attention budget of float64 over its single cache (the tensor-core
cases' bound), and within float rounding of the ragged scalar loop's output over the same records. The launch with
the step's append inside (each row flushing at its own step) runs as tests/test_batch_ragged_kivi_kernels_emulated.py
runs it (blocks reversed and in order), and through the library's DecodeStep with every launch run by its body
(tests/test_ragged_step_emulated.py's `bodies`). `..._on_the_gpu_...`: the same through MLX's CUDA
kernels (skipped without an sm_80+ CUDA GPU); nvcc: the new texts compile for sm_80 / sm_90 without local memory.
"""
from __future__ import annotations

import shutil

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import tuning
from veloxquant.accelerated.cache import masks, ragged
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import backend
from veloxquant.accelerated.ops import attention as oatt
from veloxquant.conformance.attention_checks import attention_budget, attention_f64
import test_attention_kernels_emulated as emu   # noqa: E402  (tests/ is on sys.path under pytest)
import test_batch_ragged_kivi_kernels_emulated as rb
import test_ragged_step_emulated as rs
from _attention_util import CUDA_UNIT_PRELUDE, plan_keys, resources
from _batch_util import poisoned
from test_batch_ragged_kivi_kernels_emulated import ragged_batch  # noqa: F401  (fixtures)
from test_ragged_step_emulated import bodies  # noqa: F401

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

H, REP = 2, 2
# id, key bits, value bits, G, d, window, lengths (left paddings, phases), queries dtype: KIVI 1-, 2- and 4-bit where
# tc_kivi admits them (a lane's D / 4 key codes at least one word: 1-bit keys at d = 128 only)
CASES = [
    ("k2v2-g16-d64-R0", 2, 2, 16, 64, 0, [37, 50, 64, 21], mx.float32),    # 27, 14, 0, 43: phases 11, 14, 0, 11
    ("k4v2-g32-d64-R8", 4, 2, 32, 64, 8, [37, 50, 90, 21], mx.float16),    # 53, 40, 0, 69: phases 21, 8, 0, 5
    ("k1v4-g32-d128-R0", 1, 4, 32, 128, 0, [37, 64, 90, 45], mx.float32),  # 53, 26, 0, 45: 21, 26, 0, 13
    ("k2v1-g16-d128-R5", 2, 1, 16, 128, 5, [40, 57, 66], mx.bfloat16),     # 26, 9, 0: 10, 9, 0
    ("k4v4-g16-d128-R0", 4, 4, 16, 128, 0, [30, 63, 47, 8], mx.float32),   # 33, 0, 16, 55: 1, 0, 0, 7
    # (the benchmarks' kivi b4: G = 32, window 128)
    ("k4v4-g32-d128-R128", 4, 4, 32, 128, 128, [200, 237, 181, 260], mx.float16),   # 60, 23, 79, 0: 28, 23, 15, 0
]
IDS = [c[0] for c in CASES]
TC_SPLIT_FRACTION = emu.TC_SPLIT_FRACTION
SAME = 2.0 ** -18           # tensor-core vs scalar loop, of the row's largest |output| (float32 queries)


def kv(t: int, seed: int, b: int, d: int):
    k = mx.random.normal((b, H, t, d), key=mx.random.key(seed)).astype(mx.float16)
    v = mx.random.normal((b, H, t, d), key=mx.random.key(seed + 1000)).astype(mx.float16)
    return k, v


def _make(case):
    _, kb, vb, g, d, window, lengths, _ = case
    return lambda: vc.KIVIKVCache(key_bits=kb, value_bits=vb, group_size=g, seed=2, layer=1, window=window)


def _filled(case) -> list:
    d, lengths = case[4], case[6]
    caches = []
    for i, t in enumerate(lengths):
        c = _make(case)()
        c.update_and_fetch(*kv(t, 7 + i, 1, d))
        caches.append(c)
    return caches


@pytest.fixture
def ragged_tc(monkeypatch, tune):
    """tuning's ragged and tc_ragged on, splits of 24 tokens (the rows' starts and groups fall inside splits), the
    tensor-core loop as sm_80+ takes it and 16 multiprocessors (3 encoded splits of 4 rows); plans cleared after."""
    tune(ragged=True, tc_ragged=True, tokens_per_split=24)
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 16)
    katt._static.cache_clear()
    yield
    katt._static.cache_clear()


def _plan(q, kr, vr, mask) -> katt.Plan:
    with pytest.MonkeyPatch.context() as m:
        m.setattr(backend, "available", lambda: (True, "emulated"))
        assert katt.supports(q, kr, vr, mask), "the kernels refuse the ragged step"
        return katt.launch_plan(q, kr, vr, q.shape[-1] ** -0.5, mask)


def _within_budget(got, q, single, scale, qdt, what):
    """got (1, Hq, 1, d) within conformance's attention budget of float64 over the single cache `single`."""
    qf = np.array(q.astype(mx.float32)).astype(np.float64)
    k64, v64 = (np.array(s.dequantized()).astype(np.float64) for s in (single._k, single._v))
    want, p, kr, vr = attention_f64(qf, k64, v64, scale)
    budget = attention_budget(qf, kr, vr, p, scale, True, True)
    if qdt != mx.float32:       # the output is rounded to the queries' dtype
        budget = budget + np.abs(want) * (2.0 ** -11 if qdt == mx.float16 else 2.0 ** -8)
    ratio = np.abs(got.astype(np.float64) - want) / budget
    bound = TC_SPLIT_FRACTION if qdt == mx.float32 else 1.0
    assert ratio.max() <= bound, f"{what}: worst error / budget {ratio.max():.3g} > {bound}"
    return ratio.max()


def _steps(case, on_step, steps: int | None = None) -> set:
    """Decode steps of the case's ragged batch (G + 1 unless `steps`), its single caches stepped alike; on_step(step,
    q, the step's RaggedRecords, mask, singles, the batch) at every third step and the last; returns the boundaries
    seen."""
    _, _, _, g, d, _, lengths, qdt = case
    batch = vc.KIVIKVCache.merge(_filled(case))
    assert ragged.is_ragged(batch.inner), "not one ragged B-row cache"
    singles = _filled(case)
    seen = set()
    steps = g + 1 if steps is None else steps
    for step in range(steps):
        k, v = kv(1, 900 + step, len(lengths), d)
        mask = masks.row_starts(batch.make_mask(1))
        kk, vv = batch.update_and_fetch(k, v)
        for i, c in enumerate(singles):
            c.update_and_fetch(k[i:i + 1], v[i:i + 1])
        seen.update(batch.inner._k.bounds())
        if step % 3 and step != steps - 1:
            continue
        q = mx.random.normal((len(lengths), REP * H, 1, d), key=mx.random.key(40 + step)).astype(qdt)
        on_step(step, q, kk.record, vv.record, mask, singles, batch)
    return seen


@pytest.mark.parametrize("pairs", [False, True], ids=["one", "kpairs"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_ragged_rows_on_the_tensor_core_loop_within_the_attention_budget(case, pairs, ragged_tc, tune):
    """Each row of the ragged batch through the tensor-core loop (emulated, blocks reversed, every unread byte
    poisoned) within the attention budget of float64 over its single cache, and within float rounding of the ragged
    scalar loop's output over the same records (tc_ragged off: the scalar loop); `pairs` (tc_kpairs): a warp's two
    chunks of one key group in a row, from each row's phase rounded to 32 (G >= 32)."""
    tune(tc_kpairs=pairs)
    _check_rows(case, lambda q, k, v, scale, mask: emu.emulate(q, k, v, scale, mask, reverse=True), pairs)


def _check_rows(case, run, pairs: bool = False):
    """The ragged batch's steps (_steps), each checked step's output through run(q, k, v, scale, mask) with the
    tensor-core loop and with the scalar one (see the test above); `pairs`: the loop's KP is 2 where G >= 32."""
    worst = []
    qdt = case[7]

    def check(step, q, kr, vr, mask, singles, batch):
        d = q.shape[-1]
        plan = _plan(q, kr, vr, mask)
        assert plan.key[4] is True and plan.key[7] and plan.key[8], f"not the ragged tensor-core loop: {plan.key}"
        want = 2 if pairs and case[3] >= 32 else 1
        assert dict(plan.partial_template)["KP"] == want, f"tc_kpairs={pairs}, G={case[3]}: KP != {want}"
        pk, pv = poisoned(kr, batch.inner._k), poisoned(vr, batch.inner._v)
        got = run(q, pk, pv, d ** -0.5, mask)
        with tuning.override(tc_ragged=False):
            assert not _plan(q, kr, vr, mask).key[4], "tc_ragged off: the scalar loop"
            scalar = run(q, pk, pv, d ** -0.5, mask)
        for i, c in enumerate(singles):
            worst.append(_within_budget(got[i:i + 1], q[i:i + 1], c, d ** -0.5, qdt, f"step {step}: row {i}"))
            if qdt == mx.float32:
                tol = SAME * np.abs(scalar[i]).max()
            else:       # (both rounded to the queries' dtype: one unit in its last place apart at most)
                tol = np.abs(scalar[i]).max() * (2.0 ** -10 if qdt == mx.float16 else 2.0 ** -7)
            np.testing.assert_allclose(got[i], scalar[i], rtol=0, atol=tol,
                                       err_msg=f"step {step}: row {i}, tensor-core vs scalar ragged loop")
    seen = _steps(case, check)
    assert len(seen) > len(case[6]), "the steps never moved the rows' boundaries apart"
    assert worst, "no row checked"


@pytest.mark.skipif(not emu._REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("pairs", [False, True], ids=["one", "kpairs"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_ragged_rows_on_the_tensor_core_loop_on_the_gpu_within_the_attention_budget(case, pairs, tune):
    """The same cases through MLX's CUDA kernels (the hardware's mma accumulation), the batch stepped by the GPU's own
    fused decode step; tc_kpairs off and on."""
    tune(ragged=True, tc_ragged=True, tokens_per_split=24, fuse_append=False, tc_kpairs=pairs)
    # (fuse_append off: a fused step leaves its token pending for the attention launch, so the records that
    # update_and_fetch returns lack it. `poisoned` waits for the in-place plan's pending store before it copies)
    katt._static.cache_clear()
    _check_rows(case, lambda q, k, v, scale, mask: np.array(katt.attention(q, k, v, scale, mask).astype(mx.float32)),
                pairs)


def _kernels(monkeypatch) -> list:
    """(name, header, source) of each partial kernel katt._kernel compiles from here on (CUDA recorded, not run)."""
    seen = []
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("cuda", "recorded"))
    monkeypatch.setattr(backend, "available", lambda: (True, "recorded"))
    monkeypatch.setattr(backend, "cuda_kernel", lambda **kw: seen.append((kw["name"], kw["header"], kw["source"]))
                        or object())
    katt._compiled.cache_clear()
    return seen


def test_tc_ragged_picks_the_loop_of_ragged_launches_only(ragged_tc):
    """The knob: with tc_ragged on a ragged KIVI batch's partial is the tensor-core loop (its own plan key and compiled
    kernel: the 't' and 'g' of its name, the KIVI tensor-core body with VQ_RAGGED 1), off the ragged scalar loop; the
    pair tc_kivi refuses (1-bit keys at d = 64), tc_kivi off or tensor_cores off keep the scalar loop; a single KIVI
    cache's launch is the same with the knob on or off."""
    case = CASES[0]
    plans = {}

    def record(step, q, kr, vr, mask, singles, batch):
        for on in (True, False):
            with tuning.override(tc_ragged=on):
                plans[on] = _plan(q, kr, vr, mask)
                plans[on, "single"] = katt.launch_plan(q[:1], *(oatt.PackedRecord(s.params, *_fields(s)) for s in
                                                                (singles[0]._k, singles[0]._v)), case[4] ** -0.5)
        for knob in ("tc_kivi", "tensor_cores"):
            with tuning.override(**{knob: False}):
                assert not _plan(q, kr, vr, mask).key[4], f"{knob} off: the scalar loop"
    _steps(case, record, steps=1)
    on, off = plans[True], plans[False]
    assert on.key[4] is True and on.key[7:] == (True, True) and "U" not in dict(on.partial_template), on.key
    assert off.key[4] is False and off.key[7:] == (True, True) and "U" in dict(off.partial_template), off.key
    assert dict(on.partial_template)["RW"] == dict(off.partial_template)["RW"] == case[5]
    assert plans[True, "single"].key == plans[False, "single"].key and plans[True, "single"].key[4]
    d1 = CASES[0][:1] + (1, 2, 16, 64, 0, [37, 50], mx.float32)       # (1-bit keys at d = 64: tc_kivi refuses)
    _steps(d1, lambda step, q, kr, vr, mask, *_: _assert_scalar(_plan(q, kr, vr, mask)), steps=1)
    with pytest.MonkeyPatch.context() as m:
        seen = _kernels(m)
        katt._kernel("partial", *on.key)
        katt._kernel("partial", *off.key)
        katt._compiled.cache_clear()
    (n_on, h_on, s_on), (n_off, _, s_off) = seen
    assert n_on != n_off and n_on.endswith("g") and "t2" in n_on and "t" not in n_off.split("_")[3], (n_on, n_off)
    assert "#define VQ_RAGGED 1" in s_on and "kgrp = VQ_KGROW(tb)" in s_on and "mma" in h_on, n_on
    assert "kgrp" not in s_off, n_off


def _assert_scalar(plan):
    assert plan.key[4] is False and plan.key[8], plan.key


def _fields(s):
    r = s.record()
    return {n: a for n, a in r.items() if n != "window"}, r["window"], s._q, s._method.decode_tokens


# ---- the fused decode step (the append inside, each row flushing at its own step) on the tensor-core loop ----
STEP_CASES = [("g16-R0", 16, 0, [37, 50, 64, 21]), ("g32-R8", 32, 8, [37, 50, 90, 21])]   # (phases 11 14 0 11, 21 8 0 5)


@pytest.fixture
def tc_bodies(bodies, monkeypatch, tune):
    """tests/test_ragged_step_emulated.py's `bodies` (every launch run by its body) with the tensor-core loop as sm_80+
    takes it, tuning's tc_ragged on and 32 multiprocessors (several encoded splits)."""
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 32)
    tune(tc_ragged=True)
    katt._static.cache_clear()
    yield bodies
    katt._static.cache_clear()


def _fused_steps(g: int, window: int, lengths: list) -> set:
    """G + 2 decode steps of a ragged KIVI 2-bit batch (d = 64) through DecodeStep, each row's bytes and output checked
    against its single cache after every step (tests/test_ragged_step_emulated.py's _step); the rows that flushed."""
    return rs.fused_steps(lambda: vc.KIVIKVCache(bits=2, group_size=g, seed=2, layer=1, window=window), lengths, g + 2)


@pytest.mark.parametrize("on", [True, False], ids=["tc_ragged", "tc_ragged-off"])
@pytest.mark.parametrize("g, window, lengths", [c[1:] for c in STEP_CASES], ids=[c[0] for c in STEP_CASES])
def test_a_ragged_batch_steps_through_the_fused_decode_step_on_the_tensor_core_loop(tc_bodies, g, window, lengths,
                                                                                    on, tune):
    """The library's DecodeStep over a ragged batch, every launch run by its body: with tc_ragged every fused step's
    partial (the append inside) is the ragged tensor-core kernel, off the ragged scalar one; each row's bytes and
    output are its single cache's after every step (each row flushing at its own step)."""
    tune(tc_ragged=on)
    flushed = _fused_steps(g, window, lengths)
    assert flushed == set(range(len(lengths))), f"the steps flushed rows {sorted(flushed)} only"
    fused_steps = [x for x in tc_bodies.launches if x["key"][6]]
    assert len(fused_steps) == g + 1, tc_bodies.launches
    assert all(x["key"][7] and x["key"][8] and x["key"][4] is on for x in fused_steps), tc_bodies.launches


@pytest.mark.skipif(not emu._REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("g, window, lengths", [c[1:] for c in STEP_CASES], ids=[c[0] for c in STEP_CASES])
def test_a_ragged_batch_steps_through_the_fused_decode_step_on_the_gpu_tensor_core_loop(g, window, lengths,
                                                                                       monkeypatch, tune):
    """The same steps with MLX's CUDA kernels: the fused steps' partial is the ragged tensor-core kernel (its compiled
    name: 't' and 'g'), each row's bytes and output its single cache's."""
    tune(ragged=True, tc_ragged=True)
    katt._static.cache_clear()
    names = rs.compiled_kernels(monkeypatch)
    assert _fused_steps(g, window, lengths) == set(range(len(lengths)))
    ragged_tc = [a for kind, a in names if kind == "partial" and a["tc"] and a["append"] and a["ragged"]]
    assert ragged_tc, f"no ragged tensor-core partial launched: {names}"



@pytest.mark.parametrize("window, lengths", [c[1:] for c in rb.CASES], ids=[c[0] for c in rb.CASES])
def test_the_partial_with_the_append_inside_on_the_tensor_core_loop(window, lengths, ragged_batch, monkeypatch,
                                                                    tune):
    """tests/test_batch_ragged_kivi_kernels_emulated.py's launch with the step's append inside (each row flushing at
    its own step; blocks reversed, and at a flush in order too: the same output), on the tensor-core loop: each row's
    bytes after the launch and its output are its single cache's."""
    tune(tc_ragged=True)
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 32)
    katt._static.cache_clear()
    keys = plan_keys(monkeypatch)
    rb.test_the_ragged_partial_with_the_append_steps_each_row_as_its_own_cache(window, lengths, ragged_batch)
    assert keys and all(k[4] is True and k[6] and k[8] for k in keys), keys

# ---- nvcc: the ragged tensor-core partial as attention.py launches it, sm_80 / sm_90, no local memory ----
COMPILE_CASES = [   # key bits, value bits, G, d, window, append inside
    (2, 2, 32, 128, 8, False), (2, 2, 32, 128, 8, True), (4, 4, 32, 128, 0, True), (1, 4, 32, 128, 128, True),
    (2, 2, 16, 64, 8, True), (4, 2, 16, 64, 0, False),
]
_CUDA_TYPES = {mx.float16: "__half", mx.bfloat16: "__nv_bfloat16", mx.float32: "float"}


def _launched(kb, vb, g, d, window, append):
    """(header, source, input names, outputs, template) of the ragged tensor-core partial _static plans for a batch of
    4 rows, 8 KV heads (GQA 4) and float16 queries and chunks, tuning's defaults with tc_ragged on."""
    from veloxquant import spec
    kp, vp = (spec.Params("kivi", bits=b, group_size=g, window=window, role=r).resolved() for b, r in ((kb, "k"),
                                                                                                        (vb, "v")))
    f16 = mx.float16
    st = katt._static(kp, vp, 4, 32, 1, d, 8, 16, True, False, f16, d ** -0.5, False, 16,
                      tuning.DEFAULT.replace(tc_ragged=True), (f16, f16, f16, f16) if append else None, True, True)
    assert st.key[4] is True and st.key[8], st.key
    header, source = katt.src.assemble("partial", "cuda", 4, 4, True, False, True, append, True, True)
    tmpl = [(n, _CUDA_TYPES.get(v, v)) for n, v in st.template]
    return header, source, st.names, st.template, tmpl


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
@pytest.mark.parametrize("case", COMPILE_CASES, ids=[f"k{c[0]}v{c[1]}-g{c[2]}-d{c[3]}-R{c[4]}{'-append' if c[5] else ''}"
                                                     for c in COMPILE_CASES])
@pytest.mark.parametrize("pairs", [False, True], ids=["one", "kpairs"])
def test_cuda_ragged_tensor_core_partial_compiles_without_spills(case, pairs, monkeypatch, tmp_path, tune):
    """The ragged tensor-core partial (tc_ragged) as attention.py launches it (its template from _static: prefetch
    depth, launch bounds of tc_min_blocks threadgroups), without and with the decode step's append inside, a warp's
    chunks one at a time and in pairs (tc_kpairs): sm_80 and sm_90, no stack frame and no spills."""
    from test_attention_kernels_source import _kernel
    tune(tc_kpairs=pairs)
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 132)
    katt._static.cache_clear()
    try:
        header, source, names, _, tmpl = _launched(*case)
    finally:
        katt._static.cache_clear()
    append = case[5]
    dt = "__half"
    types = dict(q=dt, kc1="uint32_t", vc1="uint32_t", kgs=dt, kgz=dt, vgs=dt, vgz=dt, kw=dt, vw=dt, kx=dt, vx=dt,
                 kf=dt, vf=dt, kconst="uint32_t", vconst="uint32_t", flags="bool" if append else "uint32_t",
                 nenc="int32_t", rstart="int32_t", rphase="int32_t", token="bool")
    outs = katt.src.APPEND_OUTPUTS if append else katt.src.PARTIAL_OUTPUTS
    text = (CUDA_UNIT_PRELUDE + header
            + katt._bounds(tuning.DEFAULT.partial_threads, tuning.DEFAULT.tc_min_blocks)
            + "namespace mlx::core::cu {\n" + _kernel("partial_tc_ragged", source, names, outs, types, tmpl) + "}\n")
    res = resources(text, tmp_path / "partial_tc_ragged")
    print(case, res)
    for arch, (regs, stack, stores, loads) in res.items():
        assert stack == stores == loads == 0 and regs <= 255, (arch, regs, stack, stores, loads)
