"""tuning.tc_sign_select (csrc/tc_sign_select.cuh): prod's QJL signs in a tensor-core loop made from their code bits
(the sign table is [+1, -1]: float16 1.0 with the bit as its sign) instead of a warp shuffle per entry. The same
entries, so the output is bit for bit the knob-off one (emulated here, and on a GPU); which kernels take it, that they
compile without local memory, and that their PTX has fewer shuffles."""
from __future__ import annotations

import re
import shutil
import subprocess

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import attention_source as src
from test_attention_kernels_emulated import _REAL_MMA, _packed, emulate, tensor_cores  # noqa: F401  (fixture)

IDS = src.METHOD_IDS
PROD, RVQ, TQ = "turboquant_prod", "turboquant_rvq", "turboquant"
CASES = [   # (keys, values), (B, Hkv, rep, L, T, d), query dtype, causal
    (((PROD, dict(bits=4)), (PROD, dict(bits=4))), (1, 1, 4, 1, 600, 128), mx.float32, False),
    (((PROD, dict(bits=4)), (TQ, dict(bits=4))), (1, 2, 2, 2, 75, 128), mx.float16, True),
    (((TQ, dict(bits=4)), (PROD, dict(bits=4))), (2, 1, 4, 1, 140, 64), mx.float16, False),
    (((RVQ, dict(bits=2, bits2=1)), (RVQ, dict(bits=4, bits2=1))), (1, 1, 4, 1, 300, 128), mx.float32, False),
    (((RVQ, dict(bits=2, bits2=2)), (PROD, dict(bits=3))), (1, 1, 2, 1, 90, 128), mx.bfloat16, False),
]
IDS_ = ["prod4-prod4", "prod4-tq4-causal", "tq4-prod4-d64", "rvq2+1-rvq4+1", "rvq2+2-prod3"]


def _records(case, seed: int = 3):
    ((km, kkw), (vm, vkw)), (b, hkv, rep, lq, t, d), qdt, causal = case
    rng = np.random.default_rng(t + d)
    kp = spec.Params(km, role="k", seed=seed, layer=1, **kkw).resolved()
    vp = spec.Params(vm, role="v", seed=seed, layer=1, **vkw).resolved()
    k = _packed(mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16), kp)
    v = _packed(mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16), vp)
    q = mx.array(rng.standard_normal((b, hkv * rep, lq, d)).astype(np.float32)).astype(qdt)
    return q, k, v, d ** -0.5, "causal" if causal else None


@pytest.mark.parametrize("case", CASES, ids=IDS_)
def test_the_select_is_the_same_lookup(case, tensor_cores, tune, monkeypatch):
    """The emulated launch with VQ_SIGN_SELECT (what the knob puts in a CUDA launch's header) against without: the
    output bit for bit (prod's signs in either role or both; rvq's streams beside them keep their shuffles)."""
    tune(tc_two_stage=True, tc_prod3=True)
    q, k, v, scale, mask = _records(case)
    assert katt.launch_plan(q, k, v, scale, mask).key[4], f"{case[0]}: not the tensor-core loop"
    plain = emulate(q, k, v, scale, mask)
    real = src.partial_body
    monkeypatch.setattr(src, "partial_body", lambda *a, **kw: "#define VQ_SIGN_SELECT 1\n" + real(*a, **kw))
    sel = emulate(q, k, v, scale, mask)
    assert np.array_equal(plain.view(np.uint8), sel.view(np.uint8)), \
        f"tc_sign_select changed the output of {case[0]}: worst {np.abs(plain.astype(np.float64) - sel).max()}"


@pytest.mark.parametrize("mk, mv, tc, takes", [
    (IDS[PROD], IDS[PROD], src.TC_TENS, True), (IDS[RVQ], IDS[TQ], True, False), (IDS[TQ], IDS[PROD], True, True),
    (IDS[TQ], IDS[TQ], True, False), (IDS["kivi"], IDS["kivi"], True, False), (IDS[PROD], IDS[PROD], False, False)],
    ids=["prod", "rvq-tq", "tq-prod", "tq", "kivi", "scalar"])
def test_the_knob_reaches_only_two_stream_loops(mk, mv, tc, takes, monkeypatch, tune):
    """The CUDA launch's header defines VQ_SIGN_SELECT, under a name of its own, for a tensor-core partial that reads
    prod's signs only; with the knob off (the default) every kernel keeps its name and header."""
    from test_attention_kernels_source import recorded_cuda_kernels
    seen = recorded_cuda_kernels(monkeypatch)
    for on in (False, True):
        tune(tc_sign_select=on)
        katt._compiled.cache_clear()
        katt._kernel("partial", mk, mv, False, False, tc, append=True)
        name, header = seen[-1]
        want = on and takes
        assert ("#define VQ_SIGN_SELECT 1" in header) is want and name.endswith("_ss") is want, \
            f"_kernel(partial, {mk}, {mv}, tc={tc}) with tc_sign_select={on}: {name}"
    katt._compiled.cache_clear()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_the_selecting_loop_compiles_without_spills_and_with_fewer_shuffles(tmp_path, monkeypatch):
    """prod b4 (both roles, the append inside; keys only) as attention.py launches it, with and without the knob's
    define: sm_80 and sm_90, no local memory; with it the PTX has fewer shuffles (the signs made from their bits)."""
    import test_attention_kernels_source as tks
    import test_tc_two_stage_emulated as t2
    units, local = [], tks._local_memory
    real = tks.ptxas

    def keep(text, stem):
        units.append(text)
        return real(text, stem)
    monkeypatch.setattr(tks, "ptxas", keep)
    variants = (([(3, 3, 3, 1, 3, 1, 128, False, True)], src.TC_TENS),
                ([(3, 0, 3, 1, 4, 1, 128, False, False)], src.TC_TENS))
    shuffles = []
    for define in ("", "#define VQ_SIGN_SELECT 1\n"):
        monkeypatch.setattr(tks, "_local_memory", lambda header, body, stem, entry, bounds=True, d=define: local(
            d + header, body, stem, entry, bounds))
        for i, (v, tc) in enumerate(variants):
            units.clear()
            t2._compile_without_spills(v, tmp_path / f"ss{i}{len(define)}", tc, f"partial_ss{i}")
            cu = tmp_path / f"u{i}{len(define)}.cu"
            cu.write_text(units[-1])
            subprocess.run(["nvcc", "-ptx", "-arch=sm_90", str(cu), "-o", str(cu.with_suffix(".ptx"))], check=True,
                           capture_output=True)
            shuffles.append(len(re.findall(r"shfl\.sync\.idx", cu.with_suffix(".ptx").read_text())))
    (both0, keys0), (both1, keys1) = shuffles[:2], shuffles[2:]
    assert both1 < both0 and keys1 < keys0, \
        f"shuffles in the PTX without / with the knob: prod b4 both roles {both0} / {both1}, prod keys beside " \
        f"turboquant 4 {keys0} / {keys1}"


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("case", CASES, ids=IDS_)
def test_the_knob_leaves_the_output_bit_for_bit_on_the_gpu(case, tune):
    """The compiled partial with the knob off and on over the same records: the same output bits."""
    tune(tc_two_stage=True, tc_prod3=True)
    q, k, v, scale, mask = _records(case)
    outs = []
    for on in (False, True):
        tune(tc_sign_select=on)
        katt._static.cache_clear()
        outs.append(np.array(katt.attention(q, k, v, scale, mask).astype(mx.float32)))
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), \
        f"attention({case[0]}) with tc_sign_select: output bits differ from the knob off"
