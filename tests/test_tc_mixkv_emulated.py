"""KIVI keys beside turboquant values on the partial kernel's tensor-core loop (tuning's tc_mixkv; attention_source.
TC_MIXK, csrc/tc_mixkv_*.cuh): the keys' score pass as KIVI's (tc_kivi_scores.cuh: the query times the key group's
scales, the codes exact in float16, zq), the values' m-tiles as turboquant's (tc_loop_values.cuh, the 3-bit layout or
whole words), and a MIXED partial's split S - 1 (the keys' window, KIVI's residual group and R, beside the values'
records, every row the append encodes: attention_source.MIXED_WINDOWS, HASWIN 2; with the values' window too, HASWIN
4, an exact value there rotated into the values' domain) and the window split in scalar arithmetic inside the
tensor-core kernel (csrc/tc_mixed_split.h with tc_mixkv_token.h). Emulated on the CPU (tests/
test_attention_kernels_emulated.py's emulator) against float64 within the bounds of turboquant b4's tensor-core cases,
the scalar MIXED partial over the same records within them too; the append inside the partial (the fused decode
step) bit for bit; which pairs take the loop with the knob on and off; an nvcc compile without local memory. The GPU
twins (`on_the_gpu`) run the same cases through the compiled kernel (skipped without an sm_80+ CUDA GPU)."""
from __future__ import annotations

import re
import shutil

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import attention as aatt
from veloxquant.accelerated.kernels import attention as katt
from test_attention_kernels_emulated import (_REAL_MMA, _packed, emulate,  # noqa: F401
                                             tensor_cores)
from test_tc_mixed_emulated import (_p, _takes, appends_on_the_loop, loops_match_on_the_gpu, on_the_gpu,
                                    prefetch_is_the_same_arithmetic, within_the_budget)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

src = katt.src
TQ = "turboquant"
# keys' (bits, group size, window R), values' (turboquant's bits or "rabitq", window), (B, Hkv, rep, L, T, d), queries
# dtype, causal, query scale, value scale, how: "mixed" (the MIXED partial: HASWIN 2 with the values' window 0, else 4), "aligned"
# (accelerated.attention.aligned: the values' tokens past the keys' prefix decoded into a window of the same length,
# HASWIN 1), "plain" (equal counts, no window: HASWIN 0)
CASES = [
    ((4, 32, 128), (4, 0), (1, 2, 4, 1, 128 + 300 + 7, 128), mx.float32, False, 2.0, 1.0, "mixed"),
    ((2, 32, 128), (4, 0), (1, 2, 4, 1, 128 + 64 + 5, 64), mx.float32, False, 1.0, "ramp", "mixed"),
    ((4, 32, 32), (3, 0), (1, 1, 2, 2, 32 + 75 + 9, 64), mx.float16, True, 2.0, 1.0, "mixed"),
    ((4, 64, 128), (2, 0), (2, 1, 4, 1, 128 + 140 + 20, 128), mx.bfloat16, False, 40.0, 1e-3, "mixed"),
    ((2, 16, 0), (4, 0), (1, 1, 4, 1, 300 + 11, 128), mx.float32, False, 1e-3, 300.0, "mixed"),     # R = 0
    ((4, 32, 0), (3, 0), (1, 2, 4, 1, 530 + 3, 128), mx.float32, False, 1.0, 1.0, "mixed"),
    ((1, 32, 128), (4, 0), (1, 2, 4, 1, 128 + 90 + 30, 128), mx.float32, False, 1.0, 1.0, "mixed"),
    ((4, 32, 128), (2, 0), (2, 2, 1, 1, 128 + 100 + 3, 128), mx.float32, False, 1.0, 1.0, "mixed"),  # one query row
    ((2, 64, 128), (3, 0), (1, 1, 3, 1, 128 + 200 + 50, 64), mx.float32, True, 2.0, 1.0, "mixed"),  # three
    ((4, 32, 32), (4, 32), (1, 2, 4, 1, 32 + 300 + 9, 128), mx.float32, False, 2.0, 1.0, "mixed"),   # HASWIN 4
    ((4, 32, 0), (4, 64), (1, 1, 2, 2, 64 + 75 + 9, 64), mx.float32, True, 2.0, 1.0, "mixed"),     # values' longer
    ((2, 16, 32), (3, 128), (1, 2, 4, 1, 128 + 140 + 20, 128), mx.bfloat16, False, 40.0, 1e-3, "mixed"),
    ((4, 32, 32), (2, 32), (1, 1, 2, 2, 32 + 96, 64), mx.float16, True, 2.0, "ramp", "mixed"),     # the counts meet
    ((4, 32, 0), (4, 0), (1, 2, 4, 1, 256, 128), mx.float32, False, 2.0, 1.0, "plain"),
    ((2, 32, 0), (3, 0), (1, 1, 2, 2, 96, 64), mx.float16, True, 2.0, 1.0, "plain"),
    ((4, 32, 128), (4, 0), (1, 2, 4, 1, 128 + 300 + 7, 128), mx.float32, False, 2.0, 1.0, "aligned"),
    ((4, 16, 32), (2, 0), (1, 1, 2, 2, 32 + 75 + 9, 64), mx.float32, True, 2.0, "ramp", "aligned"),
    # rabitq values (1-bit codes, a factor (n s_d) / ip per token)
    ((4, 32, 128), ("rabitq", 0), (1, 2, 4, 1, 128 + 300 + 7, 128), mx.float32, False, 2.0, 1.0, "mixed"),
    ((2, 16, 32), ("rabitq", 32), (1, 1, 2, 2, 32 + 75 + 9, 64), mx.float16, True, 2.0, "ramp", "mixed"),
    ((4, 32, 0), ("rabitq", 64), (1, 2, 4, 1, 64 + 140 + 20, 128), mx.float32, False, 1.0, 1.0, "mixed"),
    ((4, 32, 128), ("rabitq", 0), (1, 1, 2, 2, 128 + 75 + 9, 64), mx.float32, True, 2.0, 1.0, "aligned"),
]


def _id(c) -> str:
    (kb, g, r), (vb, vr), shape, qdt, causal, *_, how = c
    return f"kivi{kb}g{g}R{r}-{_vname(vb)}R{vr}-d{shape[5]}-{str(qdt).replace('mlx.core.', '')}-{how}"


def _vname(vb) -> str:
    return vb if isinstance(vb, str) else f"tq{vb}"


def _haswin(c) -> int:
    how, vr = c[-1], c[1][1]
    return {"aligned": 1, "plain": 0}.get(how, 4 if vr else 2)


def _records(c):
    """(q, k, v, scale, mask, mixed) of a case: KIVI keys (their window R), turboquant or rabitq values (none, or R)."""
    (kb, g, r), (vb, vr), (b, hkv, rep, lq, t, d), qdt, causal, qs, vs, how = c
    rng = np.random.default_rng(t + d + r + vr)
    kp = spec.Params("kivi", role="k", window=r, seed=3, layer=1, bits=kb, group_size=g).resolved()
    vkw = {} if isinstance(vb, str) else dict(bits=vb)
    vp = spec.Params(vb if vkw == {} else TQ, role="v", window=vr, seed=3, layer=1, **vkw).resolved()
    kx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
    vscale = np.logspace(-3, 3, t)[None, None, :, None] if vs == "ramp" else vs
    vx = mx.array((rng.standard_normal((b, hkv, t, d)) * vscale).astype(np.float32)).astype(mx.float32)
    q = mx.array((rng.standard_normal((b, hkv * rep, lq, d)) * qs).astype(np.float32)).astype(qdt)
    k, v = _packed(kx, kp), _packed(vx, vp)
    if how == "aligned":
        k, v = aatt.aligned(k, v)
    assert (k.encoded == v.encoded) == (how != "mixed") or vr, "the case's records"
    return q, k, v, 1.0 / np.sqrt(d), "causal" if causal else None, how == "mixed"


def _check(c, run, loop=src.TC_MIXK):
    """The case through `run(q, k, v, scale, mask, mixed)` on `loop` (TC_MIXK's; False: the scalar loop), within the
    attention budget (test_tc_mixed_emulated.within_the_budget)."""
    within_the_budget(_records(c), run, loop, _haswin(c), f"loop {loop}, case {_id(c)}")


def _emulated(q, k, v, scale, mask, mixed):
    return emulate(q, k, v, scale, mask, mixed=mixed)


@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_kivi_keys_turboquant_values_on_the_tensor_core_loop_within_the_attention_budget(c, tensor_cores, tune):
    """tuning's tc_mixkv: KIVI 1-, 2- and 4-bit keys (groups 16-64, windows 0-128) beside turboquant 2-, 3- and 4-bit
    values (no window, or one of 32-128, longer than the keys' too), d = 64 and 128, float32 / float16 / bfloat16
    queries, causal, value norms 1e-3 .. 1e3 in a split: the MIXED partial (its split S - 1 in scalar arithmetic in
    the tensor-core kernel), aligned records (the window split) and equal counts; within turboquant b4's bounds. Off,
    the same calls take the scalar loop, whose output is within the same bounds."""
    tune(tc_mixkv=False, tokens_per_split=64)
    _check(c, _emulated, loop=False)
    tune(tc_mixkv=True)
    _check(c, _emulated)


WINDOWED = [c for c in CASES if c[-1] != "plain"]


@pytest.mark.parametrize("c", WINDOWED, ids=[_id(c) for c in WINDOWED])
def test_window_prefetch_is_the_same_arithmetic_on_the_tc_mixkv_loop(c, tensor_cores, tune, monkeypatch):
    """tuning's tc_window_prefetch in the scalar splits (csrc/tc_mixed_split.h, VQ_WPF, with tc_mixkv_token.h's
    register sets): the emulated output is bit for bit the one without it."""
    tune(tc_mixkv=True, tokens_per_split=64)
    prefetch_is_the_same_arithmetic(_records(c), src.TC_MIXK, _id(c), monkeypatch)


FUSED_CASES = [CASES[0], CASES[9], CASES[13], CASES[15]]


@pytest.mark.parametrize("c", FUSED_CASES, ids=[_id(c) for c in FUSED_CASES])
def test_kivi_keys_turboquant_values_with_the_combine_fused(c, tensor_cores, tune):
    """... with the combine inside the partial launch (tuning's fuse_combine: the last block of a query group merges
    the splits, split S - 1's scalar state among them)."""
    tune(tc_mixkv=True, tokens_per_split=64, fuse_combine=True)
    assert katt.launch_plan(*_records(c)[:5], mixed=c[-1] == "mixed").fused
    _check(c, _emulated)


@pytest.mark.parametrize("kpairs", [False, True], ids=["kpairs-off", "kpairs-on"])
def test_the_kpairs_order_is_the_same_result(kpairs, tensor_cores, tune):
    """tuning's tc_kpairs on TC_MIXK (KP 2: a warp's two consecutive chunks in one key group, the query fragments
    built once): KP as the plan says, within the budget either way."""
    c = CASES[0]
    tune(tc_mixkv=True, tokens_per_split=64, tc_kpairs=kpairs)
    plan = katt.launch_plan(*_records(c)[:5], mixed=True)
    assert dict(plan.partial_template)["KP"] == (2 if kpairs else 1), plan.partial_template
    _check(c, _emulated)


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_kivi_keys_turboquant_values_on_the_gpu_within_the_attention_budget(c, tune):
    """The tc_mixkv cases through the compiled kernel (the hardware's mma accumulation)."""
    tune(tc_mixkv=True, tokens_per_split=64)
    katt._static.cache_clear()
    _check(c, on_the_gpu)


APPEND_CASES = [
    # keys (method, kw, R), values (method, kw, R), (B, Hkv, rep, T, d), x dtype, causal: T after the step
    (("kivi", dict(bits=4, group_size=32), 128), (TQ, dict(bits=4), 0), (1, 2, 2, 128 + 64, 64), mx.float16,
     False),                                                 # the keys flush a group (window back at R)
    (("kivi", dict(bits=4, group_size=32), 128), (TQ, dict(bits=4), 0), (1, 2, 2, 128 + 64 + 7, 128), mx.float16,
     False),
    (("kivi", dict(bits=2, group_size=32), 32), (TQ, dict(bits=3), 0), (2, 1, 3, 32 + 64, 64), mx.bfloat16, True),
    (("kivi", dict(bits=4, group_size=64), 0), (TQ, dict(bits=2), 0), (1, 2, 2, 128 + 5, 128), mx.float16, False),
    (("kivi", dict(bits=4, group_size=64), 0), (TQ, dict(bits=4), 0), (1, 2, 2, 128, 128), mx.float16, False),  # flush
    (("kivi", dict(bits=4, group_size=32), 32), (TQ, dict(bits=4), 32), (1, 2, 2, 32 + 64 + 9, 64), mx.float16,
     True),                                                  # both windowed (HASWIN 4)
    (("kivi", dict(bits=2, group_size=16), 32), (TQ, dict(bits=4), 32), (1, 2, 2, 32 + 64, 64), mx.float16, False),
    (("kivi", dict(bits=4, group_size=32), 0), (TQ, dict(bits=4), 64), (1, 2, 2, 64 + 75, 64), mx.float32, True),
    (("kivi", dict(bits=4, group_size=32), 128), ("rabitq", {}, 0), (1, 2, 2, 128 + 64, 64), mx.float16, False),
    (("kivi", dict(bits=2, group_size=32), 32), ("rabitq", {}, 32), (1, 2, 2, 32 + 64 + 9, 128), mx.float16, True),
]


@pytest.mark.parametrize("case", APPEND_CASES, ids=[f"kivi{c[0][1]['bits']}g{c[0][1]['group_size']}R{c[0][2]}"
                                                   f"-{_vname(c[1][1].get('bits', c[1][0]))}R{c[1][2]}"
                                                   f"-T{c[2][3]}-d{c[2][4]}"
                                                   for c in APPEND_CASES])
def test_append_inside_the_partial_on_the_tc_mixkv_loop(case, monkeypatch, tune):
    """The fused decode step's launch (the append inside the MIXED partial) on the TC_MIXK loop: split S - 1 encodes
    the values' token and, at a flush, the keys' group leaving their window into their rows (poisoned first: bit for
    bit accelerated.ops' one-shot encode), copies the chunk into the keys' window, and attends those rows and the
    window in scalar arithmetic beside the encoded splits' mma loop; blocks in both orders; the output within the
    float64 bound (tests/test_attention_kernels_emulated.py's MIXED check, with this loop asserted)."""
    tune(tc_mixkv=True)
    appends_on_the_loop(case, monkeypatch, tune, src.TC_MIXK, 4 if case[1][2] else 2)


@pytest.mark.parametrize("kp,vp,d,how", [
    (_p("kivi", "k", 128, bits=4, group_size=32), _p(TQ, "v", bits=4), 128, "mixed"),    # the 5-bit budget's pick
    (_p("kivi", "k", 128, bits=4, group_size=32), _p(TQ, "v", bits=4), 64, "aligned"),
    (_p("kivi", "k", 32, bits=2, group_size=16), _p(TQ, "v", bits=3), 64, "mixed"),
    (_p("kivi", "k", 0, bits=4, group_size=64), _p(TQ, "v", bits=2), 128, "mixed"),
    (_p("kivi", "k", 128, bits=1, group_size=32), _p(TQ, "v", bits=1), 128, "mixed"),
    (_p("kivi", "k", 32, bits=4, group_size=32), _p(TQ, "v", 32, bits=4), 128, "mixed"),    # HASWIN 4
    (_p("kivi", "k", 128, bits=2, group_size=32), _p("rabitq", "v"), 128, "mixed"),
    (_p("kivi", "k", 128, bits=4, group_size=32), _p("rabitq", "v"), 64, "aligned"),
], ids=["kivi4-tq4-R128", "kivi4-tq4-d64-aligned", "kivi2-tq3", "kivi4-tq2-R0", "kivi1-tq1-d128", "kivi4R32-tq4R32",
        "kivi2-rabitq", "kivi4-rabitq-d64-aligned"])
def test_kivi_keys_beside_turboquant_values_take_the_loop_with_tc_mixkv(kp, vp, d, how, tensor_cores, tune):
    """With tuning's tc_mixkv on, KIVI 1-, 2- or 4-bit keys (at least 128 bits a token) beside turboquant values (4
    bits; 3 with tc_3bit, 1 or 2 with tc_codes) or rabitq values (tc_codes) take TC_MIXK, as the MIXED partial with the
    keys' window or both, or aligned; off, the scalar loop; and with the values' own knob off (tc_3bit, tc_codes), the
    scalar loop."""
    tune(tc_mixkv=True)
    assert _takes(kp, vp, d, how) == src.TC_MIXK
    tune(tc_mixkv=False)
    assert not _takes(kp, vp, d, how), "tc_mixkv off: the scalar loop"
    tune(tc_mixkv=True)
    if vp.method == "rabitq" or vp.bits != 4:
        tune(**({"tc_3bit": False} if vp.bits == 3 and vp.method == TQ else {"tc_codes": False}))
        assert not _takes(kp, vp, d, how), "the values' layout knob off: the scalar loop"


@pytest.mark.parametrize("kp,vp,d,how", [
    (_p("kivi", "k", 128, bits=1, group_size=32), _p(TQ, "v", bits=4), 64, "mixed"),      # 64 bits a token
    (_p("kivi", "k", 128, bits=3, group_size=32), _p(TQ, "v", bits=4), 128, "mixed"),     # 3-bit KIVI keys
    (_p("kivi", "k", 128, bits=4, group_size=32), _p(TQ, "v", bits=4), 256, "mixed"),
    (_p("kivi", "k", 128, bits=4, group_size=32), _p("turboquant_rvq", "v"), 128, "mixed"),
    (_p("kivi", "k", 128, bits=4, group_size=32), _p("turboquant_prod", "v", bits=4), 128, "mixed"),
    (_p("kivi", "k", 128, bits=4, group_size=32), _p("mlx_affine", "v", bits=4), 128, "mixed"),
], ids=["kivi1-d64", "kivi3-keys", "d256", "rvq-values", "prod-values", "affine-values"])
def test_pairs_tc_mixkv_does_not_hold_stay_on_the_scalar_loop(kp, vp, d, how, tensor_cores, tune):
    """tc_mixkv on (and every other tc knob): KIVI keys outside the key layouts, other head dims and KIVI keys beside
    values other than turboquant's and rabitq's (their own layouts: rvq's two streams, prod's signs, mlx_affine's
    groups) keep the scalar loop."""
    tune(tc_mixkv=True, tc_mixed=True, tc_prod3=True, tc_two_stage=True, tc_codes=True, tc_affine=True)
    assert not _takes(kp, vp, d, how)


# (keys' bits and group, values' bits, D, HASWIN, FUSED, APPEND, input dtype, KP) as attention.py and the fused decode
# step launch TC_MIXK
NVCC_VARIANTS = [(4, 32, 4, 128, 2, False, True, "__half", 2), (4, 32, 4, 128, 2, False, False, "__half", 2),
                 (4, 32, 4, 64, 2, False, True, "__half", 2), (2, 32, 3, 128, 2, False, True, "__nv_bfloat16", 2),
                 (4, 64, 2, 128, 2, False, True, "__half", 2), (2, 16, 4, 128, 2, False, True, "__half", 1),
                 (1, 32, 4, 128, 2, True, False, "__half", 2), (4, 32, 4, 128, 1, True, False, "__half", 2),
                 (4, 32, 3, 128, 0, False, False, "__nv_bfloat16", 2), (2, 32, 4, 64, 1, False, False, "__half", 2),
                 (4, 32, 4, 128, 4, False, True, "__half", 2), (4, 64, 3, 64, 4, False, True, "__nv_bfloat16", 2),
                 (4, 32, 4, 128, 4, True, False, "__half", 2), (4, 32, "rabitq", 128, 2, False, True, "__half", 2),
                 (2, 32, "rabitq", 64, 4, False, True, "__nv_bfloat16", 2)]


def _tcmixk_unit(variants, mix: tuple[int, int]) -> tuple[str, list[str]]:
    """(one CUDA unit, its kernels' names): the TC_MIXK partial of each of `variants` (NVCC_VARIANTS' rows) as
    attention.py launches it (its prefetch depth from _tc_prefetch, KP from tc_kpairs, the launch bounds of
    tc_min_blocks threadgroups), its scalar splits from `mix` (tc_mixed_splits, tc_mixed_cost: mixed_defines)."""
    from veloxquant.accelerated import tuning
    from veloxquant.accelerated.kernels import methods as km
    from _attention_util import CUDA_UNIT_PRELUDE
    from test_attention_kernels_source import _UNDEF, _kernel
    header, body, names = "", "", []
    for i, (kb, kg, vb, d, haswin, fused, append, dt, kpairs) in enumerate(variants):
        mv = 2 if vb == "rabitq" else 0
        h, partial = src.assemble("partial", "cuda", 4, mv, haswin, fused, src.TC_MIXK, append)
        header = h if append or not header else header       # (an APPEND header holds the others' helpers too)
        kp = spec.Params("kivi", bits=kb, group_size=kg, window=128, role="k").resolved()
        vp = spec.Params(vb, role="v").resolved() if mv else spec.Params(TQ, bits=vb, role="v").resolved()
        vb = km._code_bits(vp)[0]
        types = dict(q=dt, kc1="uint32_t", kgs="__half", kgz="__half", vc1="uint32_t", vs0="float", vs1="float", kw=dt,
                     vw=dt,
                     flags="bool" if append else "uint32_t", nenc="int32_t", cnt="int32_t", out=dt, kx=dt, vx=dt,
                     kf=dt, vf=dt, kconst="uint32_t", vconst="uint32_t", token="bool")
        tmpl = [("MK", 4), ("MV", mv), ("KB1", kb), ("KB2", 1), ("VB1", vb), ("VB2", 1), ("D", d), ("QB", 4),
                ("NT", tuning.DEFAULT.partial_threads), ("P", min(32, d // 8)), ("KG", kg), ("VG", 1), ("CAUSAL", 0),
                ("HASWIN", haswin), ("FUSED", int(fused)), ("APPEND", int(append)), ("OT", dt)]
        if append:
            tmpl += [("KTS", "__half"), ("VTS", "float"), ("KXT", dt), ("VXT", dt)] + [
                (f"{r}C{n}", c) for r, p in (("K", kp), ("V", vp)) for n, c in zip(("B1", "B2", "GS"),
                                                                                   km.code_constants(p))]
        tmpl += [("PF", katt._tc_prefetch(kp, vp, tuning.DEFAULT.tc_prefetch)), ("KP", kpairs)]
        outs = src.APPEND_OUTPUTS if append else src.FUSED_OUTPUTS if fused else src.PARTIAL_OUTPUTS
        name = f"partial_tcmixk_{i}"
        names.append(name)
        body += _kernel(name, partial, src.inputs("partial", 4, mv, haswin, fused, append), outs, types, tmpl)
        body += _UNDEF + ("#undef cnt\n#undef out\n" if not fused else "") + "".join(
            f"#undef {n}\n#undef {n}_strides\n" for n in ("kx", "vx", "kf", "vf"))
    header = src.mixed_defines(*mix) + header       # (csrc/partial_setup_mixed.h)
    return (CUDA_UNIT_PRELUDE + header + katt._bounds(tuning.DEFAULT.partial_threads, tuning.DEFAULT.tc_min_blocks)
            + "namespace mlx::core::cu {\n" + body + "}\n"), names


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_tc_mixkv_partial_compiles_without_spills(tmp_path):
    """The TC_MIXK partial as attention.py launches it: KIVI 1 / 2 / 4-bit keys beside turboquant 2 / 3 / 4-bit values
    and rabitq values, d 64 and 128, the MIXED partial (HASWIN 2, 4) with the decode step's append inside and without,
    the combine fused, aligned windows and none, the scalar splits as the defaults launch them: sm_80 and sm_90, at
    most 255 registers and no local memory."""
    from veloxquant.tools.dev.kernel_resources import ptxas_resources
    from _attention_util import ptxas
    text, names = _tcmixk_unit(NVCC_VARIANTS, src.mixed_knobs(src.TC_MIXK, 2, False))
    for arch, log in ptxas(text, tmp_path / "attention_tcmixk").items():
        res = {n: r for n, r in ptxas_resources(log).items() if "partial_tcmixk_" in n}
        assert len(res) == len(names), (arch, sorted(res))
        print(arch, "registers", sorted((int(re.search(r"partial_tcmixk_(\d+)", n).group(1)), r["registers"])
                                        for n, r in res.items()))
        assert all(r["registers"] <= 255 for r in res.values()), (arch, res)
        assert not any(r.get("stack_bytes", 0) or r.get("spill_stores", 0) for r in res.values()), (arch, res)


def _ptx_instructions(text: str, stem) -> int:
    """PTX instructions (lines ending in ';' inside the kernel's body, not declarations) of `text` for sm_90."""
    import subprocess
    cu = stem.with_suffix(".cu")
    cu.write_text(text)
    ptx = stem.with_suffix(".ptx")
    r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-ptx", str(cu), "-o", str(ptx)], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return sum(1 for line in ptx.read_text().splitlines()
               if line.startswith("\t") and line.rstrip().endswith(";") and not line.lstrip().startswith((".", "//")))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_the_counted_scalar_splits_keep_the_partial_short(tmp_path):
    """The 5-bit pick's TC_MIXK partial (keys kivi 4, values turboquant 4, d 128, the append inside) with the scalar
    splits counted per launch (the defaults) is at most 1.25x as long in PTX as with split S - 1 alone: the count as a
    macro, expanded at every use, made it 1.63x, and that text cost the launch 2-3 us where its count was 1
    (docs/decode-step-analysis.md)."""
    one, counted = (_ptx_instructions(_tcmixk_unit([NVCC_VARIANTS[0]], mix)[0], tmp_path / f"pick_{mix[0]}")
                    for mix in ((1, 0), src.mixed_knobs(src.TC_MIXK, 2, False)))
    assert counted <= 1.25 * one, f"TC_MIXK partial, PTX instructions: split S - 1 alone {one}, counted {counted}"


GPU_STEP_CASES = [("kivi4-tq4", dict(key_method="kivi", key_bits=4, value_method=TQ, value_bits=4)),
                  ("kivi2-tq3-g64", dict(key_method="kivi", key_bits=2, value_method=TQ, value_bits=3, group_size=64)),
                  ("kivi4-tq4-w32", dict(key_method="kivi", key_bits=4, value_method=TQ, value_bits=4, window=32)),
                  ("kivi2-rabitq", dict(key_method="kivi", key_bits=2, value_method="rabitq"))]


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("fuse_append", [False, True], ids=["append-launch", "append-inside"])
@pytest.mark.parametrize("name, kw", GPU_STEP_CASES, ids=[c[0] for c in GPU_STEP_CASES])
@pytest.mark.parametrize("whole", [False, True], ids=["views", "whole-windows"])
def test_tc_mixkv_decode_steps_on_the_gpu_match_the_scalar_loop(monkeypatch, tune, name, kw, fuse_append, whole):
    """A cache of docs/quality-retrieval.md's pick at the 5-bit budget (KIVI 4 keys + turboquant 4 values; also 2 + 3
    with G = 64, both with a window of 32: HASWIN 4, and KIVI 2 keys beside rabitq values) on the GPU: a 300-token prefill, then 200 decode steps (several
    KIVI flushes) through the DecodeStep's MIXED launch, with tc_mixkv on (every partial launched is TC_MIXK's) and
    off (the scalar loop's): the stored bytes identical, the outputs within the attention tolerance. `whole`: both
    loops with tuning's whole_windows (csrc/window_bind.h)."""
    loops_match_on_the_gpu(monkeypatch, tune, name, kw, "tc_mixkv", src.TC_MIXK, fuse_append=fuse_append,
                           whole_windows=whole)
