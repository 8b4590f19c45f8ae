"""Turboquant keys beside KIVI values on the partial kernel's tensor-core loop (tuning's tc_mixed; attention_source.
TC_MIX, csrc/tc_mixed_*.cuh): the keys' score pass in the 3-bit layout or whole words (tc_tens_*.cuh), the values'
m-tiles as KIVI's (tc_kivi_values.cuh), and a MIXED partial's split S - 1 (the values' window beside the keys'
records, every row the append encodes: attention_source.MIXED_WINDOWS, HASWIN 3; with the keys' window too, HASWIN
4) and the window split in scalar arithmetic inside the tensor-core kernel (csrc/tc_mixed_split.h). Emulated on the
CPU (tests/test_attention_kernels_emulated.py's emulator) against float64 within the bounds of turboquant b4's
tensor-core cases; the append inside the partial (the fused decode step) bit for bit; which pairs take the loop with
the knob on and off; an nvcc compile without local memory. The GPU twins run the same cases through the compiled
kernel (skipped without an sm_80+ CUDA GPU)."""
from __future__ import annotations

import shutil

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import attention as aatt
from veloxquant.accelerated.kernels import attention as katt
from _attention_util import plan_keys
from test_attention_kernels_emulated import (MIXED_CASES, TC_SPLIT_FRACTION, _REAL_MMA, _packed, emulate,  # noqa: F401
                                             tensor_cores, test_mixed_roles_through_one_partial as _mixed_roles)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

src = katt.src
TQ = "turboquant"
# keys' bits, values' (bits, group size, window), (B, Hkv, rep, L, T, d), queries dtype, causal, query scale, value
# scale, how: "mixed" (the MIXED partial, HASWIN 3; "mixed-kR": the keys with a window of R too, HASWIN 4),
# "aligned" (accelerated.attention.aligned: the keys' tokens past the values' prefix decoded into a window of the
# same length, HASWIN 1), "plain" (equal counts, no window: HASWIN 0)
CASES = [
    (3, (2, 32, 128), (1, 2, 4, 1, 128 + 300 + 7, 128), mx.float32, False, 2.0, 1.0, "mixed"),
    (3, (2, 32, 128), (1, 2, 4, 1, 128 + 64, 64), mx.float32, False, 1.0, "ramp", "mixed"),
    (3, (1, 32, 32), (1, 1, 2, 2, 32 + 75 + 9, 64), mx.float16, True, 2.0, 1.0, "mixed"),
    (3, (4, 64, 128), (2, 1, 4, 1, 128 + 140 + 20, 128), mx.bfloat16, False, 40.0, 1e-3, "mixed"),
    (3, (2, 16, 0), (1, 1, 4, 1, 300 + 11, 128), mx.float32, False, 1e-3, 300.0, "mixed"),
    (4, (2, 32, 128), (1, 2, 4, 1, 128 + 530 + 3, 128), mx.float32, False, 1.0, 1.0, "mixed"),
    (4, (4, 32, 32), (1, 1, 2, 2, 32 + 75, 64), mx.float16, True, 2.0, "ramp", "mixed"),
    (2, (1, 32, 128), (1, 2, 4, 1, 128 + 90 + 30, 128), mx.float32, False, 1.0, 1.0, "mixed"),
    (3, (2, 32, 128), (2, 2, 1, 1, 128 + 100 + 3, 128), mx.float32, False, 1.0, 1.0, "mixed"),     # one query row
    (4, (2, 64, 128), (1, 1, 3, 1, 128 + 200 + 50, 64), mx.float32, True, 2.0, 1.0, "mixed"),      # three
    (3, (2, 32, 32), (1, 2, 4, 1, 32 + 300 + 9, 128), mx.float32, False, 2.0, 1.0, "mixed-k32"),
    (3, (2, 32, 32), (1, 1, 2, 2, 32 + 96, 64), mx.float16, True, 2.0, "ramp", "mixed-k32"),    # the counts meet
    (4, (4, 64, 128), (2, 1, 4, 1, 128 + 140 + 20, 128), mx.bfloat16, False, 40.0, 1e-3, "mixed-k16"),
    (2, (1, 32, 0), (1, 2, 4, 1, 300 + 7, 128), mx.float32, True, 1.0, "ramp", "mixed-k32"),    # the keys' window
    (3, (2, 32, 32), (1, 1, 2, 2, 64 + 75 + 9, 64), mx.float32, True, 2.0, 1.0, "mixed-k64"),     # the longer one
    (3, (2, 32, 0), (1, 2, 4, 1, 256, 128), mx.float32, False, 2.0, 1.0, "plain"),
    (3, (4, 32, 0), (1, 1, 2, 2, 96, 64), mx.float16, True, 2.0, 1.0, "plain"),
    (3, (2, 32, 128), (1, 2, 4, 1, 128 + 300 + 7, 128), mx.float32, False, 2.0, 1.0, "aligned"),
    (4, (1, 32, 32), (1, 1, 2, 2, 32 + 75 + 9, 64), mx.float32, True, 2.0, "ramp", "aligned"),
]


def _id(c) -> str:
    kb, (vb, g, r), shape, qdt, causal, *_, how = c
    return f"tq{kb}-kivi{vb}g{g}R{r}-d{shape[5]}-{str(qdt).replace('mlx.core.', '')}-{how}"


def _records(c):
    """(q, k, v, scale, mask, mixed) of a case: turboquant keys (no window, or "mixed-kR"'s R), KIVI values."""
    kb, (vb, g, r), (b, hkv, rep, lq, t, d), qdt, causal, qs, vs, how = c
    rng = np.random.default_rng(t + d + r)
    kr = int(how.split("-k")[1]) if "-k" in how else 0
    kp = spec.Params(TQ, role="k", window=kr, seed=3, layer=1, bits=kb).resolved()
    vp = spec.Params("kivi", role="v", window=r, seed=3, layer=1, bits=vb, group_size=g).resolved()
    kx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
    vscale = np.logspace(-3, 3, t)[None, None, :, None] if vs == "ramp" else vs
    vx = mx.array((rng.standard_normal((b, hkv, t, d)) * vscale).astype(np.float32)).astype(mx.float32)
    q = mx.array((rng.standard_normal((b, hkv * rep, lq, d)) * qs).astype(np.float32)).astype(qdt)
    k, v = _packed(kx, kp), _packed(vx, vp)
    if how == "aligned":
        k, v = aatt.aligned(k, v)
    assert (k.encoded == v.encoded) == (how != "mixed") or kr, "the case's records"
    return q, k, v, 1.0 / np.sqrt(d), "causal" if causal else None, how.startswith("mixed")


HASWIN = {"mixed": 3, "aligned": 1, "plain": 0}


def _check(c, run):
    """The case through `run(q, k, v, scale, mask, mixed)` on the TC_MIX loop, within the attention budget
    (within_the_budget)."""
    within_the_budget(_records(c), run, src.TC_MIX, HASWIN[c[-1].split("-k")[0]] + ("-k" in c[-1]),
                      f"TC_MIX loop, case {_id(c)}")


def within_the_budget(records, run, loop, haswin: int, name: str) -> None:
    """`records` (q, k, v, scale, mask, mixed) through `run(q, k, v, scale, mask, mixed)`, its plan on `loop` with
    HASWIN `haswin`, against float64 over the records' decode within conformance's attention budget
    (TC_SPLIT_FRACTION of it for float32 queries, as turboquant b4's tensor-core cases; both MIXED loops' checks)."""
    from veloxquant.conformance.attention_checks import attention_budget, attention_f64
    q, k, v, scale, mask, mixed = records
    plan = katt.launch_plan(q, k, v, scale, mask, mixed=mixed)
    assert plan.key[4] == loop and int(plan.key[2]) == haswin, plan.key
    got = run(q, k, v, scale, mask, mixed).astype(np.float64)
    qf = np.array(q.astype(mx.float32)).astype(np.float64)
    k64, v64 = np.array(k.dequantized()).astype(np.float64), np.array(v.dequantized()).astype(np.float64)
    want, p, kr, vr = attention_f64(qf, k64, v64, scale, mask)
    budget = attention_budget(qf, kr, vr, p, scale, True, False)
    if q.dtype != mx.float32:
        budget = budget + np.abs(want) * (2.0 ** -11 if q.dtype == mx.float16 else 2.0 ** -8)
    ratio = np.abs(got - want) / budget
    bound = TC_SPLIT_FRACTION if q.dtype == mx.float32 else 1.0
    assert ratio.max() <= bound, (f"{name}: worst error / budget {ratio.max():.3g} > {bound} at "
                                  f"{np.unravel_index(ratio.argmax(), ratio.shape)}")


@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_turboquant_keys_kivi_values_on_the_tensor_core_loop_within_the_attention_budget(c, tensor_cores, tune):
    """tuning's tc_mixed: turboquant 2-, 3- and 4-bit keys beside KIVI 1-, 2- and 4-bit values (groups 16-64,
    windows 0-128), d = 64 and 128, float32 / float16 / bfloat16 queries, causal, value norms 1e-3 .. 1e3 in a split:
    the MIXED partial (its split S - 1 in scalar arithmetic in the tensor-core kernel), aligned records (the window
    split) and equal counts; within turboquant b4's bounds. Off, the same calls take the scalar loop."""
    q, k, v, scale, mask, mixed = _records(c)
    tune(tc_mixed=False, tokens_per_split=64)
    assert not katt.launch_plan(q, k, v, scale, mask, mixed=mixed).key[4], "tc_mixed off: the scalar loop"
    tune(tc_mixed=True)
    _check(c, lambda q, k, v, scale, mask, mixed: emulate(q, k, v, scale, mask, mixed=mixed))


def prefetch_is_the_same_arithmetic(records, loop, name: str, monkeypatch) -> None:
    """`records` (q, k, v, scale, mask, mixed) on `loop`, emulated with tuning's tc_window_prefetch (VQ_WPF) and
    without: the outputs bit for bit the same (both MIXED loops' prefetch tests)."""
    from test_attention_kernels_emulated import _window_prefetch
    q, k, v, scale, mask, mixed = records
    assert katt.launch_plan(q, k, v, scale, mask, mixed=mixed).key[4] == loop
    plain = emulate(q, k, v, scale, mask, mixed=mixed)
    with monkeypatch.context() as m:
        _window_prefetch(m)
        ahead = emulate(q, k, v, scale, mask, mixed=mixed)
    assert np.array_equal(plain.view(np.uint8), ahead.view(np.uint8)), \
        f"tc_window_prefetch changed the output of case {name}"


def on_the_gpu(q, k, v, scale, mask, mixed) -> np.ndarray:
    """The call through the compiled kernels (the GPU twins' `run`)."""
    return np.array(katt.attention(q, k, v, scale, mask, mixed=mixed).astype(mx.float32))


@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_window_prefetch_is_the_same_arithmetic_on_the_tc_mixed_loop(c, tensor_cores, tune, monkeypatch):
    """tuning's tc_window_prefetch in the MIXED partial's scalar splits (csrc/tc_mixed_split.h, VQ_WPF: a warp's next
    token's code words, norm, exact rows and value scales loaded while it scores one): the emulated output is bit for
    bit the one without it."""
    tune(tc_mixed=True, tokens_per_split=64)
    prefetch_is_the_same_arithmetic(_records(c), src.TC_MIX, _id(c), monkeypatch)


FUSED_CASES = [CASES[0]] + [next(c for c in CASES if how in c[-1]) for how in ("-k", "plain", "aligned")]


@pytest.mark.parametrize("c", FUSED_CASES, ids=[_id(c) for c in FUSED_CASES])
def test_turboquant_keys_kivi_values_with_the_combine_fused(c, tensor_cores, tune):
    """... with the combine inside the partial launch (tuning's fuse_combine: the last block of a query group merges
    the splits, split S - 1's scalar state among them)."""
    tune(tc_mixed=True, tokens_per_split=64, fuse_combine=True)
    assert katt.launch_plan(*_records(c)[:5], mixed=c[-1] == "mixed").fused
    _check(c, lambda q, k, v, scale, mask, mixed: emulate(q, k, v, scale, mask, mixed=mixed))


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_turboquant_keys_kivi_values_on_the_gpu_within_the_attention_budget(c, tune):
    """The tc_mixed cases through the compiled kernel (the hardware's mma accumulation)."""
    tune(tc_mixed=True, tokens_per_split=64)
    katt._static.cache_clear()
    _check(c, on_the_gpu)


APPEND_CASES = [c for c in MIXED_CASES if c[0][0] == TQ and c[1][0] == "kivi"] + [
    # keys (method, kw, R), values (method, kw, R), (B, Hkv, rep, T, d), x dtype, causal: T after the step
    ((TQ, dict(bits=4), 0), ("kivi", dict(bits=4, group_size=64), 128), (1, 2, 2, 128 + 128, 128), mx.float16, False),
    ((TQ, dict(bits=3), 0), ("kivi", dict(bits=1, group_size=32), 128), (1, 2, 4, 128 + 64 + 5, 128), mx.float32,
     False),
    ((TQ, dict(bits=2), 0), ("kivi", dict(bits=2, group_size=16), 32), (2, 1, 2, 32 + 48, 128), mx.bfloat16, True),
    ((TQ, dict(bits=4), 16), ("kivi", dict(bits=4, group_size=64), 128), (1, 2, 2, 128 + 128, 128), mx.float16, False),
    ((TQ, dict(bits=3), 8), ("kivi", dict(bits=1, group_size=16), 0), (1, 2, 4, 64 + 5, 128), mx.float32, True),
]


@pytest.mark.parametrize("case", APPEND_CASES, ids=[f"tq{c[0][1]['bits']}R{c[0][2]}-kivi{c[1][1]['bits']}"
                                                   f"g{c[1][1]['group_size']}R{c[1][2]}-T{c[2][3]}-d{c[2][4]}"
                                                   for c in APPEND_CASES])
def test_append_inside_the_partial_on_the_tc_mixed_loop(case, monkeypatch, tune):
    """The fused decode step's launch (the append inside the MIXED partial) on the TC_MIX loop: split S - 1 encodes
    the keys' token and, at a flush, the values' group leaving the window into their rows (poisoned first: bit for
    bit accelerated.ops' one-shot encode), copies the chunk into the values' window, and attends those rows and the
    window in scalar arithmetic beside the encoded splits' mma loop; blocks in both orders; the output within the
    float64 bound (tests/test_attention_kernels_emulated.py's MIXED check, with this loop asserted)."""
    tune(tc_mixed=True)
    appends_on_the_loop(case, monkeypatch, tune, src.TC_MIX, 4 if case[0][2] else 3)


def appends_on_the_loop(case, monkeypatch, tune, loop, haswin: int) -> None:
    """tests/test_attention_kernels_emulated.py's MIXED check of `case` (the append inside too) on `loop`: every
    partial planned is that loop's with HASWIN `haswin`, and some with the append inside."""
    seen = plan_keys(monkeypatch)
    _mixed_roles(case, monkeypatch, tune, tc=loop)
    appended = [k for k in seen if k[6]]
    assert appended and all(k[4] == loop and k[2] == haswin for k in seen), seen


def _takes(kp, vp, d, how, **knobs):
    """The `tc` of the launch plan of a small call with these roles' records ("mixed": the MIXED partial)."""
    rng = np.random.default_rng(7)
    x = mx.array(rng.standard_normal((1, 1, 200, d)).astype(np.float32))
    q = mx.array(rng.standard_normal((1, 2, 1, d)).astype(np.float32))
    k, v = _packed(x, kp), _packed(x, vp)
    if how == "aligned":
        k, v = aatt.aligned(k, v)
    return katt.launch_plan(q, k, v, 1.0, None, mixed=how == "mixed").key[4]


def _p(method, role, window=0, **kw):
    return spec.Params(method, role=role, window=window, seed=3, layer=1, **kw).resolved()


@pytest.mark.parametrize("kp,vp,d,how", [
    (_p(TQ, "k", bits=3), _p("kivi", "v", 128, bits=2, group_size=32), 128, "mixed"),    # the recommended pair
    (_p(TQ, "k", bits=3), _p("kivi", "v", 128, bits=2, group_size=32), 64, "aligned"),
    (_p(TQ, "k", bits=4), _p("kivi", "v", 32, bits=1, group_size=16), 64, "mixed"),
    (_p(TQ, "k", bits=2), _p("kivi", "v", 0, bits=4, group_size=64), 128, "mixed"),
    (_p(TQ, "k", bits=1), _p("kivi", "v", 128, bits=2, group_size=32), 128, "mixed"),
    (_p(TQ, "k", 32, bits=3), _p("kivi", "v", 32, bits=2, group_size=32), 128, "mixed"),    # HASWIN 4
], ids=["tq3-kivi2-R128", "tq3-kivi2-d64-aligned", "tq4-kivi1", "tq2-kivi4-R0", "tq1-kivi2-d128", "tq3R32-kivi2R32"])
def test_turboquant_keys_beside_kivi_values_take_the_loop_with_tc_mixed(kp, vp, d, how, tensor_cores, tune):
    """With tuning's tc_mixed on, turboquant keys (4 bits; 3 with tc_3bit, 1 or 2 with tc_codes and at least 128 bits a
    token) beside KIVI 1-, 2- or 4-bit values take TC_MIX, as the MIXED partial with the values' window or aligned;
    off, the scalar loop; and with the keys' own knob off (tc_3bit, tc_codes), the scalar loop. With a window on
    both roles (HASWIN 4) too. On by default (its GPU twins passed, and its A/B)."""
    assert tuning_default().tc_mixed, "tc_mixed is on by default"
    assert _takes(kp, vp, d, how) == src.TC_MIX
    tune(tc_mixed=False)
    assert not _takes(kp, vp, d, how), "tc_mixed off: the scalar loop"
    tune(tc_mixed=True)
    if kp.bits != 4:
        tune(**({"tc_3bit": False} if kp.bits == 3 else {"tc_codes": False}))
        assert not _takes(kp, vp, d, how), "the keys' layout knob off: the scalar loop"


@pytest.mark.parametrize("kp,vp,d,how", [
    (_p(TQ, "k", 32, bits=4), _p("rabitq", "v"), 64, "mixed"),                             # HASWIN 2, not KIVI
    (_p(TQ, "k", bits=1), _p("kivi", "v", 128, bits=2, group_size=32), 64, "mixed"),       # 64 bits a token
    (_p(TQ, "k", bits=3), _p("kivi", "v", 128, bits=3, group_size=32), 128, "mixed"),      # 3-bit KIVI values
    (_p(TQ, "k", bits=3), _p("kivi", "v", 128, bits=2, group_size=32), 256, "mixed"),
    (_p("kivi", "k", 128, bits=2, group_size=32), _p(TQ, "v", bits=3), 128, "mixed"),      # the roles swapped
    (_p("rabitq", "k"), _p("kivi", "v", 128, bits=2, group_size=32), 128, "mixed"),
    (_p("turboquant_prod", "k", bits=4), _p("kivi", "v", 128, bits=2, group_size=32), 128, "mixed"),
], ids=["tq4-rabitq-HASWIN2", "tq1-d64", "kivi3-values", "d256", "kivi-keys-tq-values",
        "rabitq-keys", "prod4-keys"])
def test_pairs_tc_mixed_does_not_hold_stay_on_the_scalar_loop(kp, vp, d, how, tensor_cores, tune):
    """tc_mixed on: other MIXED pairs, codes outside the loops' layouts, other head dims and the roles swapped keep
    the scalar loop (the roles swapped are tc_mixkv's: off here)."""
    tune(tc_mixed=True, tc_prod3=True, tc_mixkv=False)
    assert not _takes(kp, vp, d, how)


def tuning_default():
    from veloxquant.accelerated import tuning
    return tuning.DEFAULT


# (keys' bits, values' bits and group, D, HASWIN, FUSED, APPEND, input dtype) as attention.py and the fused decode
# step launch TC_MIX
NVCC_VARIANTS = [(3, 2, 32, 128, 3, False, True, "__half"), (3, 2, 32, 128, 3, False, False, "__half"),
                 (3, 2, 32, 64, 3, False, True, "__half"), (3, 1, 32, 128, 3, False, True, "__nv_bfloat16"),
                 (4, 4, 64, 128, 3, False, True, "__half"), (4, 2, 32, 64, 3, True, False, "__half"),
                 (2, 4, 32, 128, 3, False, True, "__half"), (3, 2, 32, 128, 1, True, False, "__half"),
                 (3, 4, 128, 128, 0, False, False, "__nv_bfloat16"), (4, 1, 16, 64, 1, False, False, "__half"),
                 (3, 2, 32, 128, 4, False, True, "__half"), (4, 4, 64, 64, 4, False, True, "__nv_bfloat16"),
                 (3, 2, 32, 128, 4, True, False, "__half")]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_tc_mixed_partial_compiles_without_spills(tmp_path):
    """The TC_MIX partial as attention.py launches it (its prefetch depth from _tc_prefetch, the launch bounds of
    tc_min_blocks threadgroups): tq 2 / 3 / 4-bit keys beside KIVI 1 / 2 / 4-bit values, d 64 and 128, the MIXED
    partial (HASWIN 3, 4) with the decode step's append inside and without, the combine fused, aligned windows and none:
    sm_80 and sm_90, no local memory (split S - 1's scalar arithmetic must not cost the mma loop registers)."""
    from veloxquant.accelerated import tuning
    from veloxquant.accelerated.kernels import methods as km
    from test_attention_kernels_source import _UNDEF, _kernel, _local_memory
    header, body, names = "", "", []
    for i, (kb, vb, vg, d, haswin, fused, append, dt) in enumerate(NVCC_VARIANTS):
        h, partial = src.assemble("partial", "cuda", 0, 4, haswin, fused, src.TC_MIX, append)
        header = h if append or not header else header       # (an APPEND header holds the others' helpers too)
        kp = spec.Params(TQ, bits=kb, role="k").resolved()
        vp = spec.Params("kivi", bits=vb, group_size=vg, window=128, role="v").resolved()
        types = dict(q=dt, kc1="uint32_t", ks0="float", vc1="uint32_t", vgs="__half", vgz="__half", kw=dt, vw=dt,
                     flags="bool" if append else "uint32_t", nenc="int32_t", cnt="int32_t", out=dt, kx=dt, vx=dt,
                     kf=dt, vf=dt, kconst="uint32_t", vconst="uint32_t", token="bool")
        tmpl = [("MK", 0), ("MV", 4), ("KB1", kb), ("KB2", 1), ("VB1", vb), ("VB2", 1), ("D", d), ("QB", 4),
                ("NT", tuning.DEFAULT.partial_threads), ("P", min(32, d // 8)), ("KG", 1), ("VG", vg), ("CAUSAL", 0),
                ("HASWIN", haswin), ("FUSED", int(fused)), ("APPEND", int(append)), ("OT", dt)]
        if append:
            tmpl += [("KTS", "float"), ("VTS", "__half"), ("KXT", dt), ("VXT", dt)] + [
                (f"{r}C{n}", c) for r, p in (("K", kp), ("V", vp)) for n, c in zip(("B1", "B2", "GS"),
                                                                                   km.code_constants(p))]
        tmpl += [("PF", katt._tc_prefetch(kp, vp, tuning.DEFAULT.tc_prefetch))]
        outs = src.APPEND_OUTPUTS if append else src.FUSED_OUTPUTS if fused else src.PARTIAL_OUTPUTS
        name = f"partial_tcmix_{i}"
        names.append(name)
        body += _kernel(name, partial, src.inputs("partial", 0, 4, haswin, fused, append), outs, types, tmpl)
        body += _UNDEF + ("#undef cnt\n#undef out\n" if not fused else "") + "".join(
            f"#undef {n}\n#undef {n}_strides\n" for n in ("kx", "vx", "kf", "vf"))
    # (the MIXED partials' scalar splits as the defaults launch them: csrc/partial_setup_mixed.h)
    header = src.mixed_defines(*src.mixed_knobs(src.TC_MIX, 3, False)) + header
    for arch, spills in _local_memory(header, body, tmp_path / "attention_tcmix", r"partial_tcmix_\d+").items():
        assert set(spills) == set(names), (arch, spills)
        assert not any(spills.values()), (arch, spills)


GPU_STEP_CASES = [("tq3-kivi2", dict(key_method=TQ, key_bits=3, value_method="kivi", value_bits=2)),
                  ("tq4-kivi4-g64", dict(key_method=TQ, key_bits=4, value_method="kivi", value_bits=4, group_size=64)),
                  ("tq3-kivi2-w32", dict(key_method=TQ, key_bits=3, value_method="kivi", value_bits=2, window=32))]


def loops_match_on_the_gpu(monkeypatch, tune, name: str, kw: dict, knob: str, loop: int, **knobs) -> None:
    """A MIXED cache of `kw` on the GPU: a 300-token prefill, then 200 decode steps (several KIVI flushes) through the
    DecodeStep's MIXED launch, with tuning's `knob` on (every partial launched is `loop`'s) and off (the scalar
    loop's), `knobs` in effect for both: the stored bytes identical, the outputs within the attention tolerance."""
    from veloxquant.accelerated.cache import VeloxKVCache
    from test_decode_step import _layer, _x
    loops = []
    real = katt._kernel
    monkeypatch.setattr(katt, "_kernel", lambda kind, *a, **k: loops.append((kind, a[4] if len(a) > 4 else 0)) or
                        real(kind, *a, **k))

    def run(on):
        tune(**knobs, **{knob: on})
        katt._static.cache_clear()
        del loops[:]
        c = VeloxKVCache(layer=1, seed=5, **kw)
        c.update_and_fetch(_x(7, t=300), _x(8, t=300))
        outs = [np.array(_layer(c, i).astype(mx.float32)) for i in range(200)]
        assert c._fast is not None and c._fast.mixed, f"{name}: not a MIXED DecodeStep"
        tcs = {t for kind, t in loops if kind == "partial"}
        assert tcs == ({loop} if on else {False}), (on, tcs)
        return outs, [np.array(a) for rec in c.state[:2] for _, a in sorted(rec.items())]
    on_out, on_state = run(True)
    off_out, off_state = run(False)
    for i, (a, b) in enumerate(zip(on_out, off_out)):
        np.testing.assert_allclose(a, b, rtol=0, atol=4e-3 * np.abs(b).max(), err_msg=f"{name}: step {i}")
    for a, b in zip(on_state, off_state):
        assert np.array_equal(a, b), f"{name}: stored state differs between the loops"


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("fuse_append", [False, True], ids=["append-launch", "append-inside"])
@pytest.mark.parametrize("name, kw", GPU_STEP_CASES, ids=[c[0] for c in GPU_STEP_CASES])
@pytest.mark.parametrize("whole", [False, True], ids=["views", "whole-windows"])
def test_tc_mixed_decode_steps_on_the_gpu_match_the_scalar_loop(monkeypatch, tune, name, kw, fuse_append, whole):
    """A cache of the recommended quality configuration (tq4 + KIVI 4; both with a window of 32: HASWIN 4) on the
    GPU: a 300-token prefill, then 200 decode steps (several KIVI flushes) through the DecodeStep's MIXED launch, with
    tc_mixed on (every partial launched is TC_MIX's) and off (the scalar loop's): the stored bytes identical, the
    outputs within the attention tolerance; then (its configurations) tests/test_decode_step.py's comparison with the
    general path, knob on. `whole`: both loops with tuning's whole_windows (csrc/window_bind.h)."""
    from test_decode_step import test_gpu_mixed_decode_step_matches_the_general_path as general
    loops_match_on_the_gpu(monkeypatch, tune, name, kw, "tc_mixed", src.TC_MIX, fuse_append=fuse_append,
                           whole_windows=whole)
    if name in ("tq3-kivi2", "tq3-kivi2-w32"):     # (the configurations that test's own GPU cases take)
        tune(tc_mixed=True)
        katt._static.cache_clear()
        general(monkeypatch, tune, name, kw, fuse_append, whole)


def test_row_starts_on_the_tc_mixed_loop(tensor_cores, monkeypatch, tune):
    """TC_MIX with row starts (a left-padded batch, equal counts: KIVI's window empty) inside a 16-token chunk and past
    a split, with the rows below the starts as stored and with all their bits set."""
    from test_attention_kernels_emulated import _row_start_case
    tune(tokens_per_split=32, tc_mixed=True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    case = ((TQ, dict(bits=3)), ("kivi", dict(bits=2, group_size=32)), (2, 4, 1, 320, 128), [0, 7, 250], mx.float32,
            False)
    for poison in (None, case[3]):
        got, want, tol, args = _row_start_case(case, lambda q, k, v, scale, mask: emulate(
            q, k, v, scale, mask, poison_below=poison))
        np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=f"TC_MIX loop, poisoned below: {poison}")
    assert katt.launch_plan(*args).key[4] == src.TC_MIX and katt.launch_plan(*args).key[7], "not TC_MIX with starts"


def test_row_starts_in_a_mixed_partial_on_the_tc_mixed_loop(tensor_cores, monkeypatch, tune):
    """... and in a MIXED partial (keys tq3 with R = 0, values KIVI 2 with R = 128: HASWIN 3), the starts within the
    common encoded prefix (kernels.attention.supports), a split cut by them, the rows below them poisoned."""
    from veloxquant.accelerated.ops import attention as oatt
    from test_attention_kernels_emulated import f64_attention
    tune(tokens_per_split=32, tc_mixed=True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    starts, t, d = [0, 7, 150], 128 + 200 + 9, 128
    rng = np.random.default_rng(11)
    kp = spec.Params(TQ, role="k", window=0, seed=4, layer=3, bits=3).resolved()
    vp = spec.Params("kivi", role="v", window=128, seed=4, layer=3, bits=2, group_size=32).resolved()
    kx, vx = (mx.array(rng.standard_normal((3, 2, t, d)).astype(np.float32)).astype(mx.float16) for _ in range(2))
    q = mx.array(rng.standard_normal((3, 8, 1, d)).astype(np.float32))
    k, v = _packed(kx, kp), _packed(vx, vp)
    mask = oatt.RowStarts(mx.array(starts, dtype=mx.int32), False, host=tuple(starts))
    assert max(starts) <= min(k.encoded, v.encoded), "supports: row starts within the common prefix"
    assert katt.launch_plan(q, k, v, d ** -0.5, mask, mixed=True).key[4] == src.TC_MIX
    qf, kd, vd = np.array(q), np.array(k.dequantized()), np.array(v.dequantized())
    want = np.concatenate([f64_attention(qf[i:i + 1], kd[i:i + 1, :, s0:], vd[i:i + 1, :, s0:], d ** -0.5, False)
                           for i, s0 in enumerate(starts)])
    for poison in (None, starts):
        got = emulate(q, k, v, d ** -0.5, mask, poison_below=poison, mixed=True)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max(), err_msg=f"poisoned: {poison}")
