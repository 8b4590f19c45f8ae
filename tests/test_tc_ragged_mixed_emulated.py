"""The mixed pair's ragged rows (turboquant keys per token beside KIVI values of each row's own group phase:
accelerated/cache/ragged.py, docs/ragged-kivi.md) on TC_MIX's tensor-core loop (tuning's tc_mixed and tc_ragged, with
ragged): the ragged MIXED partial's ranges (csrc/partial_setup_mixed_ragged.h) with the encoded splits' chunks on the
tensor cores (neither role groups tokens: no phase shift) and split S - 1 / the window split in scalar arithmetic
(csrc/tc_mixed_split.h, the values exact past the row's own boundary QVR), run by the kernel bodies on the CPU
(tests/test_attention_kernels_emulated.py's emulator: the mma loop emulated).

Per row, over the ragged cache's own records with every byte a row must not read poisoned and the blocks reversed:
the output within conformance's attention budget of float64 over its single cache (the tensor-core cases' bound for
float32 queries) and within float rounding of the ragged scalar MIXED partial over the same records. The append
inside: the library's DecodeStep with every launch run by its body (tests/test_ragged_mixed_step_emulated.py), each
row's bytes and output its single cache's at every step. `..._on_the_gpu_...`: the same through MLX's CUDA kernels
(skipped without an sm_80+ GPU); nvcc: the launched texts compile for sm_80 / sm_90 without spills.
"""
from __future__ import annotations

import shutil
import types

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import tuning
from veloxquant.accelerated.cache import ragged
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import backend
from veloxquant.conformance.attention_checks import attention_budget, attention_f64
from _attention_util import CUDA_UNIT_PRELUDE, resources
from _batch_util import poisoned
import test_attention_kernels_emulated as emu   # noqa: E402  (tests/ is on sys.path under pytest)
import test_batch_ragged_mixed_kernels_emulated as rm
import test_ragged_mixed_step_emulated as rms
import test_ragged_step_emulated as rse
from test_ragged_step_emulated import bodies  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

src = katt.src
H, REP = rm.H, rm.REP
# tests/test_batch_ragged_mixed_kernels_emulated.py's cases (values' windows 128 / 0 / 32, keys' windows 0 / 32 / 16:
# HASWIN 3 and 4, d = 64 / 128, KIVI 2 / 4 bits, turboquant 3 / 4 bits, four rows of four phases) with the queries'
# dtype: float32 (the tight bounds) or float16
CASES = [c + (qdt,) for c, qdt in zip(rm.CASES, (mx.float32, mx.float32, mx.float16, mx.float32, mx.float16))]
IDS = [c[0] for c in CASES]
SAME = 2.0 ** -18           # tensor-core vs scalar loop, of the row's largest |output| (float32 queries)


@pytest.fixture
def ragged_tc(monkeypatch, tune):
    """tuning's ragged, tc_ragged and tc_mixed on, splits of 24 tokens, the tensor-core loop as sm_80+ takes it and 32
    multiprocessors (several encoded splits of 4 rows); plans cleared after."""
    tune(ragged=True, tc_ragged=True, tc_mixed=True, tokens_per_split=24)
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 32)
    katt._static.cache_clear()
    yield
    katt._static.cache_clear()


def _plan(q, kr, vr, mask) -> katt.Plan:
    with pytest.MonkeyPatch.context() as m:
        m.setattr(backend, "available", lambda: (True, "emulated"))
        assert katt.supports(q, kr, vr, mask, True), "the kernels refuse the ragged mixed step"
        return katt.launch_plan(q, kr, vr, q.shape[-1] ** -0.5, mask, mixed=True)


def _within_budget(got, q, single, d, qdt, what) -> float:
    qf = np.array(q.astype(mx.float32)).astype(np.float64)
    k64, v64 = (np.array(s.dequantized()).astype(np.float64) for s in (single._k, single._v))
    want, p, kr, vr = attention_f64(qf, k64, v64, d ** -0.5)
    budget = attention_budget(qf, kr, vr, p, d ** -0.5, True, False)
    if qdt != mx.float32:       # the output is rounded to the queries' dtype
        budget = budget + np.abs(want) * 2.0 ** -11
    ratio = np.abs(got.astype(np.float64) - want) / budget
    bound = emu.TC_SPLIT_FRACTION if qdt == mx.float32 else 1.0
    assert ratio.max() <= bound, f"{what}: worst error / budget {ratio.max():.3g} > {bound} vs its own cache"
    return ratio.max()


def _steps(case, on_step) -> set:
    """G + 1 decode steps of the case's ragged batch, its single caches stepped alike (every row flushing at its own
    step); on_step(step, q, k record, v record, mask, singles, batch) at every third step and the last; returns the
    values' boundaries seen."""
    _, kb, vb, g, kw, vw, d, lengths, qdt = case
    batch = vc.VeloxKVCache.merge(rm._caches(kb, vb, g, kw, vw, d, lengths))
    singles = rm._caches(kb, vb, g, kw, vw, d, lengths)
    assert ragged.is_ragged(batch.inner), "not one ragged B-row cache"
    seen = set()
    for step, q, kk, vv, mask in rm.checked_steps(batch, singles, g, d, qdt,
                                                  each=lambda b: seen.update(b.inner._v.bounds())):
        on_step(step, q, kk.record, vv.record, mask, singles, batch)
    return seen


def _check_rows(case, run):
    """Each checked step's output through run(q, k, v, scale, mask) on TC_MIX's ragged loop against float64 over each
    row's single cache and against the ragged scalar MIXED partial (tc_ragged off) over the same poisoned records."""
    qdt, worst = case[-1], []
    haswin = 4 if case[4] else 3

    def check(step, q, kr, vr, mask, singles, batch):
        d = q.shape[-1]
        plan = _plan(q, kr, vr, mask)
        assert plan.key[4] == src.TC_MIX and plan.key[2] == haswin and plan.key[7] and plan.key[8], plan.key
        pk, pv = poisoned(kr, batch.inner._k), poisoned(vr, batch.inner._v)
        got = run(q, pk, pv, d ** -0.5, mask)
        with tuning.override(tc_ragged=False):
            assert not _plan(q, kr, vr, mask).key[4], "tc_ragged off: the ragged scalar MIXED partial"
            scalar = run(q, pk, pv, d ** -0.5, mask)
        for i, s in enumerate(singles):
            worst.append(_within_budget(got[i:i + 1], q[i:i + 1], s, d, qdt,
                                        f"step {step}: row {i} (values' bounds {batch.inner._v.bounds()})"))
            tol = np.abs(scalar[i]).max() * (SAME if qdt == mx.float32 else 2.0 ** -10)
            np.testing.assert_allclose(got[i], scalar[i], rtol=0, atol=tol,
                                       err_msg=f"step {step}: row {i}, TC_MIX vs the ragged scalar MIXED partial")
    seen = _steps(case, check)
    assert len(seen) > len(case[7]), "the steps never moved the rows' boundaries apart"
    assert worst, "no row checked"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_ragged_mixed_rows_on_the_tensor_core_loop_within_the_attention_budget(case, ragged_tc):
    """Each row through TC_MIX's ragged loop (emulated, blocks reversed, every unread byte poisoned) within the
    attention budget of float64 over its single cache and within float rounding of the ragged scalar MIXED partial."""
    _check_rows(case, lambda q, k, v, scale, mask: emu.emulate(q, k, v, scale, mask, reverse=True, mixed=True))


@pytest.mark.skipif(not emu._REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_ragged_mixed_rows_on_the_gpu_tensor_core_loop_within_the_attention_budget(case, tune):
    """The same cases through MLX's CUDA kernels (the hardware's mma accumulation)."""
    tune(ragged=True, tc_ragged=True, tc_mixed=True, tokens_per_split=24, fuse_append=False)
    # (fuse_append off: a fused step leaves its token pending for the attention launch, so the records that
    # update_and_fetch returns lack it. `poisoned` waits for the in-place plan's pending store before it copies)
    katt._static.cache_clear()
    _check_rows(case, lambda q, k, v, scale, mask: np.array(
        katt.attention(q, k, v, scale, mask, mixed=True).astype(mx.float32)))


def test_the_knobs_pick_the_loop_of_ragged_mixed_launches_only(ragged_tc):
    """With tc_ragged and tc_mixed on a ragged mixed launch is TC_MIX's (its own plan key and kernel name: 't', 'mx'
    and 'g'); either knob off, or tensor_cores off, the ragged scalar MIXED partial."""
    case = CASES[0]
    plans = {}

    def record(step, q, kr, vr, mask, singles, batch):
        plans["on"] = _plan(q, kr, vr, mask)
        for knob in ("tc_ragged", "tc_mixed", "tensor_cores"):
            with tuning.override(**{knob: False}):
                plans[knob] = _plan(q, kr, vr, mask)
    _steps(case, lambda *a: record(*a) if a[0] == 0 else None)
    on = plans["on"]
    assert on.key[4] == src.TC_MIX and on.key[8] and "U" not in dict(on.partial_template), on.key
    for knob in ("tc_ragged", "tc_mixed", "tensor_cores"):
        off = plans[knob]
        assert off.key[4] is False and off.key[8] and "U" in dict(off.partial_template), (knob, off.key)
        assert dict(off.partial_template)["RW"] == dict(on.partial_template)["RW"] == case[5]
    names = {}
    with pytest.MonkeyPatch.context() as m:
        m.setattr(backend, "_gpu_backend", lambda: ("cuda", "recorded"))
        m.setattr(backend, "available", lambda: (True, "recorded"))
        m.setattr(backend, "cuda_kernel", lambda **kw: names.setdefault(kw["name"], kw["source"]) and object())
        katt._compiled.cache_clear()
        katt._kernel("partial", *on.key)
        katt._kernel("partial", *plans["tc_ragged"].key)
        katt._compiled.cache_clear()
    tags = sorted(n.split("_")[3] for n in names)
    assert tags == ["0430rg", "0430t2mxrg"], tags
    assert all("#define VQ_RAGGED 1" in s for s in names.values()), list(names)


# ---- the append inside: the library's DecodeStep, every launch run by its body ----
@pytest.mark.parametrize("on", [True, False], ids=["tc", "tc-off"])
@pytest.mark.parametrize("g, window, lengths, inside", [c[1:] for c in rms.CASES], ids=[c[0] for c in rms.CASES])
def test_a_ragged_mixed_batch_steps_through_the_fused_decode_step_on_the_tensor_core_loop(
        bodies, monkeypatch, tune, g, window, lengths, inside, on):  # noqa: F811
    """tests/test_ragged_mixed_step_emulated.py's steps (each row's bytes and output its single cache's after every
    step, every row flushing) with tc_ragged and tc_mixed on: every partial launch (with the append inside, and the
    plan's first step's without it) is TC_MIX's ragged loop; off, the ragged scalar MIXED partial."""
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 32)
    tune(tc_ragged=on, tc_mixed=True)
    katt._static.cache_clear()
    rms.test_a_ragged_mixed_batch_steps_through_the_fused_decode_step(bodies, monkeypatch, tune, g, window, lengths,
                                                                      inside)
    keys = {x["key"] for x in bodies.launches}
    assert all(k[4] == (src.TC_MIX if on else False) for k in keys), sorted(keys, key=str)
    assert any(k[6] for k in keys) == inside, sorted(keys, key=str)
    katt._static.cache_clear()


@pytest.mark.skipif(not emu._REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("g, window, lengths", [c[1:4] for c in rms.CASES[:2]], ids=[c[0] for c in rms.CASES[:2]])
def test_a_ragged_mixed_batch_steps_on_the_gpu_tensor_core_loop(g, window, lengths, monkeypatch, tune):
    """The same steps with MLX's CUDA kernels (the GPU's fused decode step): each row's bytes and output its single
    cache's, and the fused steps' partial TC_MIX's ragged kernel with the append inside."""
    tune(ragged=True, tc_ragged=True, tc_mixed=True, fuse_append=True)
    katt._static.cache_clear()
    names = rse.compiled_kernels(monkeypatch)
    make = rms._maker(g, window)
    steps = g + 2
    want = rse._singles(make, lengths, [900 + s for s in range(steps)])
    from _batch_util import filled_with
    batch = vc.VeloxKVCache.merge(filled_with(make, lengths, seed=7))
    for step in range(steps):
        rse._step(batch, 900 + step, want[step], f"step {step}")
    fused = [a for kind, a in names if kind == "partial" and a["append"]]
    assert fused and all(a["tc"] == src.TC_MIX and a["ragged"] for a in fused), names


# ---- the windowed plan (HASWIN 4) and window 0 (OWN's texts) with the append inside, on TC_MIX's loop ----
# tests/test_ragged_mixed_step_emulated.py's cases with the append inside: (g, values' window, keys' window, lengths);
# K12 the keys' window the wider, K40 the keys' boundary below the values' least one, g32-R32-K32 the benchmarks'
# window 32; R0: the values' own flushed token from the chunk (attention_source.OWN)
APPEND_CASES = [c[:5] for c in rms.WINDOWED_CASES if c[5] and c[0] != "g16-R8-K8"] + \
    [(c[0], c[1], 0, 0, c[2]) for c in rms.R0_CASES if c[3]]


def _outputs(monkeypatch) -> list:
    """Every attention output of tests/test_ragged_step_emulated.py's _step, in order (recorded as it returns)."""
    outs = []
    real = rse.vattention.attend
    monkeypatch.setattr(rse, "vattention", types.SimpleNamespace(
        attend=lambda *a, **kw: outs.append(np.array(real(*a, **kw).astype(mx.float32))) or mx.array(outs[-1])))
    return outs


@pytest.mark.parametrize("g, window, kwin, lengths", [c[1:] for c in APPEND_CASES], ids=[c[0] for c in APPEND_CASES])
def test_a_windowed_or_window_0_ragged_mixed_batch_steps_on_the_tensor_core_loop(
        bodies, monkeypatch, tune, g, window, kwin, lengths):  # noqa: F811
    """The library's DecodeStep, every launch by its body, G + 2 steps with every row's values flushing (each row's
    bytes its single cache's and its output within float64's tolerance after every step: rms._fused_steps), with
    tc_ragged and tc_mixed on: every fused step's partial TC_MIX's ragged loop with the append inside (HASWIN 4, or
    OWN's text at window 0); the same steps with tc_ragged off (the ragged scalar partial) give each step's outputs
    within float rounding (one float16 unit of the row's largest output)."""
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 32)
    outs = _outputs(monkeypatch)
    got = {}
    for on in (True, False):
        tune(tc_ragged=on, tc_mixed=True)
        katt._static.cache_clear()
        outs.clear()
        bodies.launches.clear()
        bodies.appends = 0
        rms._fused_steps(bodies, monkeypatch, tune, g, window, kwin, lengths, True)
        fused_ = [x["key"] for x in bodies.launches if x["key"][6]]
        want = (4 if kwin else 3, src.TC_MIX if on else False, True if kwin else src.OWN)
        assert fused_ and all((k[2], k[4], k[8]) == want for k in fused_), sorted(set(fused_), key=str)
        got[on] = list(outs)
    katt._static.cache_clear()
    assert len(got[True]) == len(got[False]) == g + 2
    for step, (a, b) in enumerate(zip(got[True], got[False])):
        for i in range(len(lengths)):
            np.testing.assert_allclose(a[i], b[i], rtol=0, atol=np.abs(b[i]).max() * 2.0 ** -10,
                                       err_msg=f"step {step}: row {i}, TC_MIX vs the ragged scalar MIXED partial")


@pytest.mark.skipif(not emu._REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("g, window, kwin, lengths", [c[1:] for c in APPEND_CASES], ids=[c[0] for c in APPEND_CASES])
def test_a_windowed_or_window_0_ragged_mixed_batch_steps_on_the_gpu_tensor_core_loop(g, window, kwin, lengths,
                                                                                    monkeypatch, tune):
    """The same steps with MLX's CUDA kernels (the GPU's fused decode step): each row's bytes and output its single
    cache's after every step, the fused steps' partial TC_MIX's ragged kernel with the append inside (HASWIN 4, or
    OWN's text at window 0)."""
    tune(ragged=True, tc_ragged=True, tc_mixed=True, fuse_append=True)
    katt._static.cache_clear()
    fused_ = rse.fused_partials(monkeypatch, rms._maker(g, window, kwin), lengths, g, "_v")
    want = (4, True) if kwin else (3, src.OWN)
    assert fused_ and all(a["tc"] == src.TC_MIX and (a["haswin"], a["ragged"]) == want for a in fused_), fused_


# ---- nvcc: TC_MIX's ragged partial as attention.py launches it, against the row-starts TC_MIX partial ----
# (key bits, value bits, G, keys' window, values' window, d, the append inside): the recommended pair (HASWIN 3, with
# and without the append) and keys with a window (HASWIN 4) at d = 64; with the append inside, the pair at window 32
# (HASWIN 4: the windowed plan) and at window 0 (OWN's text)
COMPILE_CASES = [(3, 2, 32, 0, 128, 128, False), (3, 2, 32, 0, 128, 128, True), (4, 4, 16, 32, 32, 64, False),
                 (3, 2, 32, 32, 32, 128, True), (3, 2, 32, 0, 0, 128, True)]


def _resources(kp, vp, d, ragged_: bool, stem, append: bool) -> dict:
    """{arch: (registers, stack frame, spill stores, spill loads)} of TC_MIX's MIXED partial with row starts as
    attention.py launches it (template from _static: 4 rows, 8 KV heads, GQA 4, float16; tc_ragged and tc_mixed on),
    `ragged_` or not, with the decode step's append inside or not."""
    from test_attention_kernels_source import _kernel
    haswin = katt.mixed_windows(kp, vp)
    f16 = mx.float16
    tune = tuning.DEFAULT.replace(ragged=True, tc_ragged=True, tc_mixed=True)
    st = katt._static(kp, vp, 4, 32, 1, d, 8, 16, haswin, False, f16, d ** -0.5, False, 16, tune,
                      (f16,) * 4 if append else None, True, ragged_)
    assert st.key[2] == haswin and st.key[4] == src.TC_MIX and bool(st.key[8:]) == ragged_, st.key
    rag = st.key[8] if ragged_ else False     # (values with R = 0 and the append: OWN's text)
    assert (rag == src.OWN) == (ragged_ and append and vp.window == 0), st.key
    header, source = src.assemble("partial", "cuda", 0, 4, haswin, False, src.TC_MIX, append, True, rag)
    h = "__half"
    types = dict(q=h, kc1="uint32_t", ks0=h, kw=h, vc1="uint32_t", vgs=h, vgz=h, vw=h, kx=h, vx=h, kf=h, vf=h,
                 kconst="uint32_t", vconst="uint32_t", flags="bool" if append else "uint32_t", nenc="int32_t",
                 rstart="int32_t", rphase="int32_t", token="bool")
    outs = src.APPEND_OUTPUTS if append else src.PARTIAL_OUTPUTS
    tmpl = [(n, h if v == f16 else v) for n, v in st.template]
    text = (CUDA_UNIT_PRELUDE + header
            + katt._bounds(tuning.DEFAULT.partial_threads, tuning.DEFAULT.tc_min_blocks)
            + "namespace mlx::core::cu {\n" + _kernel("partial_tc_mixed", source, st.names, outs, types, tmpl) + "}\n")
    return resources(text, stem)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
@pytest.mark.parametrize("case", COMPILE_CASES, ids=[f"tq{c[0]}-kivi{c[1]}-g{c[2]}-k{c[3]}-R{c[4]}-d{c[5]}"
                                                     f"{'-append' if c[6] else ''}" for c in COMPILE_CASES])
def test_cuda_ragged_tc_mixed_partial_compiles_without_spills(case, monkeypatch, tmp_path):
    """TC_MIX's ragged partial (without and with the append inside): sm_80 and sm_90, no spills and no stack frame
    beyond the row-starts TC_MIX partial's at the same template."""
    from veloxquant import spec
    kb, vb, g, kw, vw, d, append = case
    kp = spec.Params("turboquant", bits=kb, window=kw, role="k").resolved()
    vp = spec.Params("kivi", bits=vb, group_size=g, window=vw, role="v").resolved()
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 132)
    katt._static.cache_clear()
    try:
        plain, rag = (_resources(kp, vp, d, r, tmp_path / f"tcmix_{int(r)}", append) for r in (False, True))
    finally:
        katt._static.cache_clear()
    print(case, "registers, stack frame, spill stores, spill loads: starts", plain, "ragged", rag)
    for arch, (regs, stack, stores, loads) in rag.items():
        assert stores == loads == 0 and regs <= 255 and stack <= plain[arch][1], (arch, rag, plain)
