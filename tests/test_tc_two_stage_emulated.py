"""turboquant_rvq and turboquant_prod on the partial kernel's tensor-core loop (tuning's tc_two_stage;
csrc/tc_two_*.cuh): rvq's code streams each looked up in its own table (codes1 in gaussian[bits], codes2 in
residual[bits][bits2]) with its own mma pass into the same score and value accumulators; prod keys' QJL signs against
the projected query into scores of their own (times gamma A_d), prod values' signs into a second value accumulator
(the output's sketch-domain part), emulated on the CPU (tests/test_attention_kernels_emulated.py's
emulator) against float64 within the bounds of turboquant b4's tensor-core cases; with the knob off, or a stream
the loop's word layout does not hold (3 bits, a 1-bit key stream at d = 64), the scalar loop. The GPU twins run
the same cases through the compiled kernel (skipped without an sm_80+ CUDA GPU)."""
from __future__ import annotations

import shutil

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import tuning
from veloxquant.accelerated.kernels import attention as katt
from test_decode_step import gpu  # noqa: F401  (the recorded-launch fixture)
from test_attention_kernels_emulated import (_REAL_MMA, _check_tc_case, _packed, emulate, tensor_cores,  # noqa: F401
                                             test_append_inside_the_partial_moves_exact_windows as _append_windows,
                                             test_append_inside_the_partial_stores_the_append_bytes_and_attends_over_them
                                             as _append_records)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

RVQ = "turboquant_rvq"
TWO_STAGE_CASES = [
    # key method, value method, (B, Hkv, rep, L, T, d), queries dtype, causal, query scale, value scale; window
    ((RVQ, dict(bits=2, bits2=2)), (RVQ, dict(bits=2, bits2=2)), ((1, 2, 4, 1, 300, 128), mx.float32, False, 2.0, 1.0), 0),
    ((RVQ, dict(bits=4, bits2=4)), (RVQ, dict(bits=4, bits2=4)), ((2, 1, 1, 1, 40, 128), mx.float32, False, 1e-3, 3e4), 0),
    ((RVQ, dict(bits=1, bits2=2)), (RVQ, dict(bits=1, bits2=2)), ((1, 1, 4, 1, 530, 128), mx.bfloat16, False, 40.0, 1e-3), 0),
    ((RVQ, dict(bits=2, bits2=2)), (RVQ, dict(bits=1, bits2=2)), ((1, 1, 2, 2, 75, 64), mx.float16, True, 2.0, 1.0), 0),
    ((RVQ, dict(bits=4, bits2=2)), (RVQ, dict(bits=2, bits2=4)), ((1, 2, 4, 1, 600, 128), mx.float32, False, 1.0, "ramp"), 0),
    (("turboquant", dict(bits=4)), (RVQ, dict(bits=2, bits2=1)), ((2, 1, 4, 1, 140, 64), mx.float16, False, 1.0, 1.0), 0),
    ((RVQ, dict(bits=2, bits2=1)), ("rabitq", {}), ((1, 1, 4, 1, 90, 128), mx.float32, False, 1.0, 1.0), 0),
    ((RVQ, dict(bits=2, bits2=2)), (RVQ, dict(bits=2, bits2=2)), ((1, 2, 4, 1, 300, 128), mx.float32, False, 2.0, 1.0), 32),
    ((RVQ, dict(bits=2, bits2=4)), (RVQ, dict(bits=4, bits2=1)), ((1, 1, 2, 2, 75, 64), mx.float16, True, 2.0, 1.0), 5),
]


PROD = "turboquant_prod"
PROD_KEY_CASES = [
    # prod keys (mse codes of bits - 1 bits, the QJL signs) beside other tensor-core values; d = 128 (a lane's D / 4
    # signs at least one word)
    ((PROD, dict(bits=3)), ("turboquant", dict(bits=4)), ((1, 2, 4, 1, 300, 128), mx.float32, False, 2.0, 1.0), 0),
    ((PROD, dict(bits=5)), (RVQ, dict(bits=2, bits2=2)), ((2, 1, 1, 1, 40, 128), mx.float32, False, 1e-3, 3e4), 0),
    ((PROD, dict(bits=2)), ("rabitq", {}), ((1, 1, 4, 1, 530, 128), mx.bfloat16, False, 40.0, 1e-3), 0),
    ((PROD, dict(bits=3)), ("turboquant", dict(bits=2)), ((1, 1, 2, 2, 75, 128), mx.float16, True, 2.0, "ramp"), 0),
    ((PROD, dict(bits=5)), ("turboquant", dict(bits=4)), ((1, 2, 4, 1, 300, 128), mx.float32, False, 1.0, 1.0), 32),
]
PROD_VALUE_CASES = [
    # prod values (mse codes, and the QJL signs into the output's sketch-domain part) beside tensor-core keys
    (("turboquant", dict(bits=4)), (PROD, dict(bits=3)), ((1, 2, 4, 1, 300, 128), mx.float32, False, 2.0, 1.0), 0),
    ((PROD, dict(bits=5)), (PROD, dict(bits=5)), ((1, 1, 4, 1, 600, 128), mx.float32, False, 1.0, "ramp"), 0),
    ((RVQ, dict(bits=2, bits2=2)), (PROD, dict(bits=2)), ((1, 1, 2, 2, 75, 64), mx.float16, True, 2.0, 1.0), 0),
    ((PROD, dict(bits=3)), (PROD, dict(bits=3)), ((2, 1, 1, 1, 40, 128), mx.float32, False, 1e-3, 3e4), 0),
    (("turboquant", dict(bits=4)), (PROD, dict(bits=3)), ((1, 1, 4, 1, 530, 128), mx.bfloat16, False, 40.0, 1e-3), 16),
]

ALL_CASES = TWO_STAGE_CASES + PROD_KEY_CASES + PROD_VALUE_CASES
TQ = "turboquant"
PROD3_CASES = [
    # prod b4 (3-bit mse codes in the 3-bit layout, the QJL signs in their own 1-bit one: tuning's tc_prod3) in
    # either role or both, beside tensor-core methods in the other; and prod beside a 3-bit turboquant role
    ((PROD, dict(bits=4)), (TQ, dict(bits=4)), ((1, 2, 4, 1, 300, 128), mx.float32, False, 2.0, 1.0), 0),
    ((PROD, dict(bits=4)), (TQ, dict(bits=2)), ((1, 1, 2, 2, 75, 128), mx.float16, True, 2.0, "ramp"), 0),
    ((PROD, dict(bits=4)), ("rabitq", {}), ((1, 1, 4, 1, 530, 128), mx.bfloat16, False, 40.0, 1e-3), 0),
    ((TQ, dict(bits=4)), (PROD, dict(bits=4)), ((1, 2, 4, 1, 300, 128), mx.float32, False, 2.0, 1.0), 0),
    ((TQ, dict(bits=4)), (PROD, dict(bits=4)), ((2, 1, 4, 1, 140, 64), mx.float16, True, 1.0, "ramp"), 0),
    ((PROD, dict(bits=4)), (TQ, dict(bits=3)), ((1, 1, 4, 1, 600, 128), mx.float32, False, 1.0, "ramp"), 0),
    ((TQ, dict(bits=4)), (PROD, dict(bits=4)), ((2, 1, 1, 1, 40, 128), mx.bfloat16, False, 1e-3, 3e4), 0),
    ((PROD, dict(bits=4)), (TQ, dict(bits=4)), ((1, 2, 4, 1, 300, 128), mx.float32, False, 1.0, 1.0), 32),
    ((TQ, dict(bits=4)), (PROD, dict(bits=4)), ((1, 1, 2, 2, 75, 64), mx.float16, True, 2.0, 1.0), 5),
    ((PROD, dict(bits=5)), (TQ, dict(bits=3)), ((1, 1, 4, 1, 90, 128), mx.float32, False, 1.0, 1.0), 0),
    ((TQ, dict(bits=3)), (PROD, dict(bits=4)), ((1, 1, 2, 2, 75, 64), mx.float32, True, 2.0, 1.0), 0),
    ((PROD, dict(bits=4)), (PROD, dict(bits=4)), ((1, 1, 4, 1, 600, 128), mx.float32, False, 1.0, "ramp"), 0),
    ((PROD, dict(bits=4)), (PROD, dict(bits=4)), ((2, 1, 1, 1, 40, 128), mx.bfloat16, False, 1e-3, 3e4), 0),
    ((PROD, dict(bits=4)), (PROD, dict(bits=4)), ((1, 1, 2, 2, 75, 128), mx.float16, True, 2.0, 1.0), 16),
    ((PROD, dict(bits=3)), (PROD, dict(bits=4)), ((1, 2, 4, 1, 300, 128), mx.float32, False, 2.0, 1.0), 0),
]


def _id(c) -> str:
    (km, kkw), (vm, vkw), case, window = c
    name = lambda m, kw: f"rvq{kw['bits']}+{kw['bits2']}" if m == RVQ else f"{m}{kw.get('bits', '')}"   # noqa: E731
    return f"{name(km, kkw)}-{name(vm, vkw)}-d{case[0][5]}-{case[1]}-w{window}".replace("mlx.core.", "")


def _plan(methods, case, window):
    """The launch plan of a small call with these records (its key: (MK, MV, HASWIN, FUSED, TC, ...))."""
    (km, kkw), (vm, vkw) = methods
    (b, hkv, rep, lq, _, d), qdt = case[0], case[1]
    t = window + 20
    kp = spec.Params(km, role="k", window=window, seed=3, layer=1, **kkw).resolved()
    vp = spec.Params(vm, role="v", window=window, seed=3, layer=1, **vkw).resolved()
    rng = np.random.default_rng(5)
    x = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32))
    q = mx.array(rng.standard_normal((b, hkv * rep, lq, d)).astype(np.float32)).astype(qdt)
    return katt.launch_plan(q, _packed(x, kp), _packed(x, vp), 1.0 / np.sqrt(d), "causal" if case[2] else None)


@pytest.mark.parametrize("c", ALL_CASES, ids=[_id(c) for c in ALL_CASES])
def test_two_stage_codes_on_the_tensor_core_loop_within_the_attention_budget(c, tensor_cores, tune):
    """tuning's tc_two_stage: both streams of turboquant_rvq (1-, 2- and 4-bit, in either role, beside other
    tensor-core methods, with a window split) through the tensor-core loop within turboquant b4's bounds; off,
    the same calls take the scalar loop."""
    methods, case, window = c[:2], c[2], c[3]
    tune(tc_two_stage=False)
    assert not _plan(methods, case, window).key[4], "tc_two_stage off: the scalar loop"
    tune(tc_two_stage=True)
    assert _plan(methods, case, window).key[4], "tc_two_stage on: the tensor-core loop"
    _check_tc_case(case, emulate, methods, window=window)


@pytest.mark.parametrize("methods,d", [(((RVQ, dict(bits=3, bits2=2)), (RVQ, dict(bits=2, bits2=2))), 128),
                                       (((RVQ, dict(bits=2, bits2=2)), (RVQ, dict(bits=2, bits2=3))), 128),
                                       (((RVQ, dict(bits=2, bits2=1)), (RVQ, dict(bits=2, bits2=2))), 64),
                                       (((PROD, dict(bits=4)), ("turboquant", dict(bits=4))), 128),
                                       (((PROD, dict(bits=3)), ("turboquant", dict(bits=4))), 64),
                                       ((("turboquant", dict(bits=4)), (PROD, dict(bits=4))), 128)],
                         ids=["k3+2", "v2+3", "k2+1-d64", "prod4-keys", "prod3-keys-d64", "prod4-values"])
def test_streams_the_loop_does_not_hold_take_the_scalar_loop(methods, d, tensor_cores, tune):
    """3-bit streams (not in the loop's word layout: prod b4's mse codes too) and a key stream of fewer than 128
    bits a token (a lane's D / 4 codes less than one word: prod's signs at d = 64) keep the scalar loop with
    tc_two_stage on (and tc_prod3, which takes prod b4's, off)."""
    tune(tc_two_stage=True, tc_prod3=False)
    assert not _plan(methods, ((1, 1, 2, 1, 0, d), mx.float32, False), 0).key[4]


@pytest.mark.parametrize("methods,want", [(((RVQ, dict(bits=2, bits2=2)), (RVQ, dict(bits=2, bits2=2))), 2),
                                          (((RVQ, dict(bits=4, bits2=2)), (RVQ, dict(bits=2, bits2=2))), 1),
                                          (((RVQ, dict(bits=4, bits2=4)), (RVQ, dict(bits=4, bits2=4))), 1),
                                          (((PROD, dict(bits=3)), ("turboquant", dict(bits=4))), 2),
                                          (((PROD, dict(bits=5)), ("turboquant", dict(bits=4))), 1),
                                          ((("turboquant", dict(bits=4)), (PROD, dict(bits=3))), 0),
                                          (((PROD, dict(bits=3)), (PROD, dict(bits=3))), 0),
                                          (((PROD, dict(bits=4)), (TQ, dict(bits=4))), 1),
                                          (((PROD, dict(bits=5)), (TQ, dict(bits=3))), 1),
                                          (((TQ, dict(bits=4)), (PROD, dict(bits=4))), 0),
                                          (((PROD, dict(bits=4)), (PROD, dict(bits=4))), 0)],
                         ids=["rvq2+2", "rvq4+2", "rvq4+4", "prod3-tq4", "prod5-tq4", "tq4-prod3", "prod3-prod3",
                              "prod4-tq4", "prod5-tq3", "tq4-prod4", "prod4-prod4"])
def test_two_streams_prefetch_no_more_words_than_turboquant_b4(methods, want, tensor_cores, tune):
    """The prefetch depth (template PF) of two-stream records: tuning's tc_prefetch (2) while keys and values
    together hold at most 8 code bits a coordinate (turboquant b4's register sets), fewer chunks beyond; prod
    values (their second accumulator) 0; prod keys beside a 3-bit role (tc_prod3) at most 1."""
    tune(tc_two_stage=True, tc_prefetch=2, tc_prod3=True)
    plan = _plan(methods, ((1, 1, 2, 1, 0, 128), mx.float32, False), 0)
    assert plan.key[4] and dict(plan.partial_template)["PF"] == want, plan.partial_template


@pytest.mark.parametrize("c", PROD3_CASES, ids=[_id(c) for c in PROD3_CASES])
def test_prod_b4_on_the_tensor_core_loop_within_the_attention_budget(c, tensor_cores, tune):
    """tuning's tc_prod3: prod b4 keys (d = 128) and values (d = 64, 128), its 3-bit mse codes realigned from raw
    words and its signs from their own words (attention_source.PARTIAL_TC3_TWO_BODY / PARTIAL_TC3_PROD_VALUES_BODY),
    within turboquant b4's bounds; off, the same calls take the scalar loop."""
    methods, case, window = c[:2], c[2], c[3]
    tune(tc_two_stage=True, tc_prod3=False)
    assert not _plan(methods, case, window).key[4], "tc_prod3 off: the scalar loop"
    tune(tc_prod3=True)
    assert _plan(methods, case, window).key[4] == katt.src.TC_TENS, "tc_prod3 on: the 3-bit tensor-core loop"
    _check_tc_case(case, emulate, methods, window=window, tc=katt.src.TC_TENS)


@pytest.mark.parametrize("methods,d", [(((PROD, dict(bits=4)), (RVQ, dict(bits=2, bits2=2))), 128),
                                       (((RVQ, dict(bits=3, bits2=2)), (PROD, dict(bits=3))), 128),
                                       (((RVQ, dict(bits=2, bits2=2)), (TQ, dict(bits=3))), 128),
                                       (((PROD, dict(bits=4)), (TQ, dict(bits=4))), 64),
                                       (((PROD, dict(bits=4)), (PROD, dict(bits=4))), 64)],
                         ids=["prod4-rvq", "rvq3+2-prod3", "rvq-tq3", "prod4-keys-d64", "prod4-prod4-d64"])
def test_prod3_keeps_rvq_beside_3_bits_and_short_sign_words_on_the_scalar_loop(methods, d, tensor_cores, tune):
    """tc_prod3 on: turboquant_rvq beside or with 3-bit codes, and prod keys at d = 64 (a lane's D / 4 signs less
    than one word), still take the scalar loop."""
    tune(tc_two_stage=True, tc_prod3=True)
    assert not _plan(methods, ((1, 1, 2, 1, 0, d), mx.float32, False), 0).key[4]


APPEND_CASE = ((RVQ, dict(bits=2, bits2=2)), (RVQ, dict(bits=4, bits2=2)), (1, 2, 4, 1, 70, 128), mx.float16, True,
               False)
PROD_APPEND_CASE = ((PROD, dict(bits=3)), ("turboquant", dict(bits=4)), (2, 2, 2, 1, 40, 128), mx.bfloat16, True,
                    False)
PROD_VALUES_APPEND_CASE = ((PROD, dict(bits=3)), (PROD, dict(bits=5)), (1, 2, 4, 1, 70, 128), mx.float16, True,
                           False)
PROD3_APPEND_CASES = [((PROD, dict(bits=4)), (TQ, dict(bits=4)), (2, 2, 2, 1, 40, 128), mx.bfloat16, True, False),
                      ((PROD, dict(bits=4)), (PROD, dict(bits=4)), (1, 2, 4, 1, 70, 128), mx.float16, True, False),
                      ((TQ, dict(bits=2)), (PROD, dict(bits=4)), (1, 2, 4, 1, 50, 64), mx.float32, True, True)]
WINDOW_CASE = ((RVQ, dict(bits=2, bits2=2)), (RVQ, dict(bits=1, bits2=2)), (1, 1, 2, 2, 50, 64, 3), mx.float32, True,
               True)


@pytest.mark.parametrize("case", [APPEND_CASE, PROD_APPEND_CASE, PROD_VALUES_APPEND_CASE],
                         ids=["rvq", "prod-keys", "prod"])
def test_append_inside_the_partial_on_the_two_stage_loop(case, monkeypatch, tune):
    """The decode step's append inside the partial launch (APPEND) with rvq / prod records on the tensor-core
    loop: the appended rows are accelerated.ops' encode bit for bit and the attention over them within the float64
    bound (test_attention_kernels_emulated's check, with the case asserting the tensor-core loop)."""
    _append_records(case, monkeypatch, tune)


@pytest.mark.parametrize("case", PROD3_APPEND_CASES, ids=["prod4-keys", "prod4", "prod4-values-d64"])
def test_append_inside_the_partial_on_the_prod_b4_loop(case, monkeypatch, tune):
    """... with prod b4 records on the 3-bit two-stream loop (tc_prod3)."""
    tune(tc_two_stage=True, tc_prod3=True)
    _append_records(case, monkeypatch, tune)


def test_append_inside_the_partial_moves_exact_windows_on_the_two_stage_loop(monkeypatch, tune):
    """... with exact windows beside the rvq records (the window split and the append's window copy)."""
    _append_windows(WINDOW_CASE, monkeypatch, tune)


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("c", ALL_CASES, ids=[_id(c) for c in ALL_CASES])
def test_two_stage_codes_on_the_gpu_within_the_attention_budget(c, tune):
    """The tc_two_stage cases through the compiled kernel (the hardware's mma accumulation)."""
    tune(tc_two_stage=True)
    katt._static.cache_clear()
    _check_tc_case(c[2], lambda q, k, v, scale, mask: np.array(katt.attention(q, k, v, scale, mask).astype(mx.float32)),
                   c[:2], window=c[3])


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("c", PROD3_CASES, ids=[_id(c) for c in PROD3_CASES])
def test_prod_b4_on_the_gpu_within_the_attention_budget(c, tune):
    """The tc_prod3 cases through the compiled kernel (the hardware's mma accumulation)."""
    tune(tc_two_stage=True, tc_prod3=True)
    katt._static.cache_clear()
    _check_tc_case(c[2], lambda q, k, v, scale, mask: np.array(katt.attention(q, k, v, scale, mask).astype(mx.float32)),
                   c[:2], window=c[3], tc=katt.src.TC_TENS)


def _compile_without_spills(variants, stem, tc, prefix):
    """Each variant (MK, MV, KB1, KB2, VB1, VB2, D, FUSED, APPEND) compiled as attention.py launches it with loop `tc`
    (its prefetch depth from _tc_prefetch, the launch bounds of tc_min_blocks threadgroups): sm_80 and sm_90, no
    local memory."""
    from test_attention_kernels_source import _UNDEF, _kernel, _local_memory
    src = katt.src
    header, body, names = "", "", []
    for i, (mk, mv, kb1, kb2, vb1, vb2, d, fused, append) in enumerate(variants):
        h, partial = src.assemble("partial", "cuda", mk, mv, False, fused, tc, append)
        header = h if append or not header else header       # (an APPEND header holds the others' helpers too)
        kp = spec.Params(RVQ, bits=kb1, bits2=kb2, role="k").resolved() if mk == 1 else \
            spec.Params(PROD, bits=kb1 + 1, role="k").resolved() if mk == 3 else \
            spec.Params("turboquant" if mk == 0 else "rabitq", role="k", **(dict(bits=kb1) if mk == 0 else {})).resolved()
        vp = spec.Params(RVQ, bits=vb1, bits2=vb2, role="v").resolved() if mv == 1 else \
            spec.Params(PROD, bits=vb1 + 1, role="v").resolved() if mv == 3 else \
            spec.Params("turboquant", bits=vb1, role="v").resolved() if mv == 0 else spec.Params("rabitq", role="v").resolved()
        dt = "__half"
        types = dict(q=dt, kc1="uint32_t", kc2="uint32_t", vc1="uint32_t", vc2="uint32_t", ks0="float", ks1="float",
                     vs0="float", vs1="float", flags="bool" if append else "uint32_t", nenc="int32_t", cnt="int32_t",
                     out=dt, kx=dt, vx=dt, kconst="uint32_t", vconst="uint32_t", token="bool")
        tmpl = [("MK", mk), ("MV", mv), ("KB1", kb1), ("KB2", kb2), ("VB1", vb1), ("VB2", vb2), ("D", d), ("QB", 4),
                ("NT", tuning.DEFAULT.partial_threads), ("P", min(32, d // 8)), ("KG", 1), ("VG", 1), ("CAUSAL", 0),
                ("HASWIN", 0), ("PF", katt._tc_prefetch(kp, vp, tuning.DEFAULT.tc_prefetch)), ("FUSED", int(fused)),
                ("APPEND", int(append)), ("OT", dt)]
        if append:
            tmpl += [("KTS", "float"), ("VTS", "float")] + [
                (f"{r}C{n}", c) for r, p in (("K", kp), ("V", vp)) for n, c in zip(("B1", "B2", "GS"),
                                                                                   katt.km.code_constants(p))]
        outs = src.APPEND_OUTPUTS if append else src.FUSED_OUTPUTS if fused else src.PARTIAL_OUTPUTS
        name = f"{prefix}_{i}"
        names.append(name)
        body += _kernel(name, partial, src.inputs("partial", mk, mv, False, fused, append), outs, types, tmpl)
        body += _UNDEF + ("#undef cnt\n#undef out\n" if not fused else "")
    for arch, spills in _local_memory(header, body, stem, prefix + r"_\d+").items():
        assert set(spills) == set(names), (arch, spills)
        assert not any(spills.values()), (arch, spills)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_two_stage_tensor_core_partial_compiles_without_spills(tmp_path):
    """The tensor-core partial with turboquant_rvq records and prod keys as attention.py launches it (its prefetch depth from
    _tc_prefetch, the launch bounds of tc_min_blocks threadgroups), the combine launched and fused, and with the
    decode step's append inside: sm_80 and sm_90, no local memory (the second stream's register sets must fit)."""
    _compile_without_spills([(1, 1, 2, 2, 2, 2, 128, False, False), (1, 1, 4, 4, 4, 4, 128, True, False),
                             (1, 1, 2, 2, 1, 2, 64, False, False), (0, 1, 4, 1, 2, 1, 64, False, False),
                             (1, 2, 2, 1, 1, 1, 128, False, False), (1, 1, 2, 2, 4, 2, 128, False, True),
                             (3, 0, 2, 1, 4, 1, 128, False, False), (3, 1, 4, 1, 2, 2, 128, True, False),
                             (3, 0, 2, 1, 4, 1, 128, False, True), (0, 3, 4, 1, 2, 1, 128, False, False),
                             (3, 3, 4, 1, 4, 1, 128, True, False), (1, 3, 2, 2, 1, 1, 64, False, True),
                             (3, 3, 2, 1, 2, 1, 128, False, False), (1, 3, 4, 4, 2, 1, 128, False, False),
                             (2, 3, 1, 1, 4, 1, 128, False, False)], tmp_path / "attention_tc2", True, "partial_tc2")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_prod_b4_tensor_core_partial_compiles_without_spills(tmp_path):
    """... the 3-bit two-stream partials of tc_prod3: prod b4 keys beside turboquant 2 / 3 / 4 bits and rabitq, prod
    b4 values beside turboquant 3 / 4 bits (d = 64 and 128), prod b4 both roles, prod b3 / b5 beside prod b4 or 3-bit
    turboquant; launched, fused and with the append inside."""
    _compile_without_spills([(3, 0, 3, 1, 4, 1, 128, False, False), (3, 0, 3, 1, 4, 1, 128, True, False),
                             (3, 0, 3, 1, 4, 1, 128, False, True), (3, 2, 3, 1, 1, 1, 128, False, False),
                             (3, 0, 3, 1, 2, 1, 128, False, False), (3, 0, 3, 1, 3, 1, 128, False, False),
                             (0, 3, 4, 1, 3, 1, 128, False, False), (0, 3, 4, 1, 3, 1, 64, False, True),
                             (0, 3, 4, 1, 3, 1, 128, True, False), (0, 3, 3, 1, 3, 1, 64, False, False),
                             (3, 0, 4, 1, 3, 1, 128, False, False), (3, 0, 2, 1, 3, 1, 128, False, False),
                             (3, 3, 3, 1, 3, 1, 128, False, False), (3, 3, 3, 1, 3, 1, 128, True, False),
                             (3, 3, 3, 1, 3, 1, 128, False, True), (3, 3, 2, 1, 3, 1, 128, False, False),
                             (3, 3, 3, 1, 4, 1, 128, False, False)],
                            tmp_path / "attention_tc2p3", katt.src.TC_TENS, "partial_tc2p3")


@pytest.mark.parametrize("methods", [((RVQ, dict(bits=2, bits2=2)), (RVQ, dict(bits=1, bits2=2))),
                                     ((PROD, dict(bits=3)), (RVQ, dict(bits=4, bits2=4))),
                                     (("turboquant", dict(bits=4)), (PROD, dict(bits=3)))],
                         ids=["rvq", "prod-keys", "prod-values"])
def test_row_starts_in_the_two_stage_loop(methods, tensor_cores, monkeypatch, tune):
    """Row starts (a left-padded batch) inside a 16-token chunk and past a split, on the two-stream loop, with the
    rows below the starts as stored and with all their bits set."""
    from test_attention_kernels_emulated import _row_start_case
    tune(tokens_per_split=32, tc_two_stage=True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    case = (*methods, (2, 4, 1, 300, 128), [0, 7, 250], mx.float32, False)
    for poison in (None, case[3]):
        got, want, tol, args = _row_start_case(case, lambda q, k, v, scale, mask: emulate(
            q, k, v, scale, mask, poison_below=poison))
        np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=f"two-stream loop, poisoned below: {poison}")
    assert katt.launch_plan(*args).key[4], "not the tensor-core loop"


@pytest.mark.parametrize("kw", [dict(method=RVQ, bits=2, bits2=2), dict(method=RVQ, bits=4, bits2=2)],
                         ids=["rvq2+2", "rvq4+2"])
def test_fused_decode_step_of_rvq_launches_the_two_stream_loop(kw, monkeypatch, tune, gpu):
    """A turboquant_rvq cache's decode steps (recorded launches, tests/test_decode_step.py): with fuse_append the
    fast path's partial carries the append (APPEND) and is the tensor-core kernel, launching what the general path
    launches and keeping its state; with tc_two_stage off, the scalar loop's."""
    from test_decode_step import _by_name, _fused_steps, _run
    from veloxquant.accelerated.cache import VeloxKVCache

    def make():
        return VeloxKVCache(layer=0, seed=3, **kw)
    for on in (True, False):
        tune(fuse_append=True, tc_two_stage=on)
        fast, _, _ = _run(monkeypatch, gpu, general=False, tensor_cores=True, make=make)
        ref, _, _ = _run(monkeypatch, gpu, general=True, tensor_cores=True, make=make)
        fused = 0
        for _, la, _ in _fused_steps(fast, ref):
            (p,) = _by_name(la, "vq_attention_partial")
            tmpl = dict(p["template"])
            assert tmpl["APPEND"] == 1 and tmpl["MK"] == tmpl["MV"] == 1, p["template"]
            assert ("t" in p["name"].rsplit("_", 1)[1]) is on and ("U" not in tmpl) is on, (on, p["name"], tmpl)
            fused += 1
        assert fused >= 4, f"{fused} of 6 steps took the fused append"
