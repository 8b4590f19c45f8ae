"""tuning.tc_l2_prefetch (csrc/tc_l2_ahead.cuh): the generic tensor-core loop (csrc/tc_loop.cuh) asks the lines of a
warp's chunk N ahead into L2. It changes where the bytes come from, never what the kernel computes: on a GPU the
output is bit for bit the knob-off kernel's; here, which kernels take it (their header and name) and that they compile
without local memory."""
from __future__ import annotations

import shutil
import subprocess

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import attention_source as src
from veloxquant.accelerated.kernels import loader
from test_attention_kernels_emulated import _REAL_MMA, _packed

IDS = src.METHOD_IDS


@pytest.mark.parametrize("mk, mv, tc, takes", [
    (IDS["turboquant"], IDS["turboquant"], True, True), (IDS["turboquant_prod"], IDS["turboquant_prod"], src.TC_TENS, True),
    (IDS["turboquant_rvq"], IDS["turboquant"], True, True), (IDS["kivi"], IDS["kivi"], True, False),
    (IDS["mlx_affine"], IDS["mlx_affine"], True, False), (IDS["turboquant"], IDS["kivi"], src.TC_MIX, False),
    (IDS["turboquant"], IDS["turboquant"], False, False)], ids=["tq", "prod", "rvq-tq", "kivi", "affine", "mix", "scalar"])
def test_the_knob_reaches_only_the_generic_loops_header(mk, mv, tc, takes, monkeypatch, tune):
    """The CUDA launch's header defines VQ_TCL2 and vq_l2 (csrc/tc_l2.cuh), under a name of its own, for a partial on
    tc_loop.cuh only; with the knob at 0 (the default) every kernel keeps its name and header."""
    from veloxquant.accelerated.kernels import backend
    seen = []
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("cuda", "recorded"))
    monkeypatch.setattr(backend, "available", lambda: (True, "recorded"))
    monkeypatch.setattr(backend, "cuda_kernel", lambda **kw: seen.append((kw["name"], kw["header"])) or object())
    for n in (0, 3):
        tune(tc_l2_prefetch=n)
        katt._compiled.cache_clear()
        katt._kernel("partial", mk, mv, mk == IDS["turboquant"] and mv == IDS["kivi"] and 3, False, tc, append=True)
        name, header = seen[-1]
        want = bool(n) and takes
        assert ("#define VQ_TCL2 3" in header and "vq_l2" in header) is want and name.endswith("_l23") is want, \
            f"_kernel(partial, {mk}, {mv}, tc={tc}) with tc_l2_prefetch={n}: {name}"
    katt._compiled.cache_clear()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_the_prefetching_loop_compiles_without_spills(tmp_path, monkeypatch):
    """prod b4 (both roles, its values' loop at PF 0) and turboquant b4, the append inside or not, with the knob's
    header lines: sm_80 and sm_90, no local memory (the prefetch holds no registers), and the PTX has the prefetches."""
    import test_attention_kernels_source as tks
    import test_tc_two_stage_emulated as t2
    units = []
    real = tks.ptxas

    def keep(text, stem):
        units.append(text)
        return real(text, stem)
    local = tks._local_memory
    monkeypatch.setattr(tks, "ptxas", keep)
    monkeypatch.setattr(tks, "_local_memory", lambda header, body, stem, entry, bounds=True: local(
        header + "#define VQ_TCL2 2\n" + loader.text("tc_l2.cuh"), body, stem, entry, bounds))
    t2._compile_without_spills([(3, 3, 3, 1, 3, 1, 128, False, True), (3, 3, 3, 1, 3, 1, 128, False, False)],
                               tmp_path / "l2_prod", src.TC_TENS, "partial_l2p")
    t2._compile_without_spills([(0, 0, 4, 1, 4, 1, 128, False, True)], tmp_path / "l2_tq", True, "partial_l2t")
    assert len(units) == 2 and all("#define VQ_TCL2 2" in u for u in units), len(units)
    for i, u in enumerate(units):       # (the prefetches are in the code, not dropped as dead)
        (tmp_path / f"u{i}.cu").write_text(u)
        subprocess.run(["nvcc", "-ptx", "-arch=sm_90", str(tmp_path / f"u{i}.cu"), "-o", str(tmp_path / f"u{i}.ptx")],
                       check=True, capture_output=True)
        assert (tmp_path / f"u{i}.ptx").read_text().count("prefetch.L2") >= 6, f"unit {i}: no L2 prefetches in its PTX"


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("methods", [(("turboquant_prod", 4), ("turboquant_prod", 4)), (("turboquant", 4), ("turboquant", 4)),
                                     (("turboquant_rvq", 2), ("turboquant", 4))], ids=["prod", "tq", "rvq-tq"])
def test_the_knob_leaves_the_output_bit_for_bit_on_the_gpu(methods, tune):
    """The partial with tc_l2_prefetch 0, 1 and 4 over the same records (a few thousand tokens, splits of many
    chunks a warp): the same output bits (the prefetch moves no value)."""
    (km, kb), (vm, vb) = methods
    rng = np.random.default_rng(11)
    b, hkv, rep, t, d = 1, 2, 4, 5000, 128
    extra = lambda m, bits: dict(bits=bits, bits2=2) if m == "turboquant_rvq" else dict(bits=bits)   # noqa: E731
    kp = spec.Params(km, role="k", seed=3, layer=1, **extra(km, kb)).resolved()
    vp = spec.Params(vm, role="v", seed=3, layer=1, **extra(vm, vb)).resolved()
    kx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
    vx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
    q = mx.array(rng.standard_normal((b, hkv * rep, 1, d)).astype(np.float32)).astype(mx.float16)
    k, v = _packed(kx, kp), _packed(vx, vp)
    outs = {}
    for n in (0, 1, 4):
        tune(tc_l2_prefetch=n)
        katt._static.cache_clear()
        outs[n] = np.array(katt.attention(q, k, v, d ** -0.5, None))
        assert katt.launch_plan(q, k, v, d ** -0.5, None).key[4], f"{methods}: not on the tensor-core loop"
    for n in (1, 4):
        assert np.array_equal(outs[n].view(np.uint16), outs[0].view(np.uint16)), \
            f"attention({methods}) with tc_l2_prefetch={n}: output bits differ from the knob off"
