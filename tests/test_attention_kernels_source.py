"""accelerated.kernels.attention_source and commit (which also serves faults) on the CPU: CUDA and Metal share each body behind a
macro-only prelude, (where nvcc is installed) every kernel compiles for sm_90 as mx.fast.cuda_kernel
would wrap it, for each method pair, head-dim class and dtype, with no register spills in the common
configuration (d = 128, four query rows per KV head), and (where g++ is) the Metal kernels compile against
tests/metal_shim.h as mx.fast.metal_kernel would wrap them (a syntax check of the Metal names, nothing more)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from veloxquant.accelerated import tuning
from veloxquant.accelerated.kernels import attention_source as src
from veloxquant.accelerated.kernels import commit
from _attention_util import CUDA_UNIT_PRELUDE, ptxas

MACROS = ("TID", "BLOCK_X", "BLOCK_Y", "BLOCK_Z", "NBLOCK_X", "NBLOCK_Y", "NBLOCK_Z", "SHARED", "BARRIER",
          "SHFL_XOR", "SHFL_IDX", "WARP_SYNC")


@pytest.mark.parametrize("kind", ["partial", "combine"])
def test_cuda_and_metal_share_the_body(kind):
    body = src.BODIES[kind]
    for backend in ("cuda", "metal"):
        header, text = src.assemble(kind, backend)
        assert text.endswith(body) and text.count(body) == 1
        prelude = text[: -len(body)]
        assert all(not ln.strip() or ln.startswith(("#define ", "//")) for ln in prelude.splitlines())   # macros
        for m in MACROS:
            assert re.search(rf"^#define {m}\b", prelude, re.M), (backend, m)
        for helper in ("vq_exp2", "vq_max", "vq_min", "vq_round_to", "vq_code", "NEG_INF", "DEVICE"):
            assert helper in header, (backend, helper)


def _param(name, ctype, source):
    s = f"    const {ctype}* {name},\n"
    if f"{name}_shape" in source:
        s += f"    const __grid_constant__ Shape {name}_shape,\n"
    if f"{name}_strides" in source:
        s += f"    const __grid_constant__ Strides {name}_strides,\n"
    return s


def _kernel(name, header_src, ins, outs, types, consts):
    """Like mlx/backend/cuda/custom_kernel.cpp build_kernel: signature, constants, then the source."""
    text = f"__global__ void {name}(\n"
    text += "".join(_param(n, types.get(n, "float"), header_src) for n in ins)
    text += ",\n".join(f"    {types.get(n, 'float')}* {n}" for n in outs) + ") {\n"
    for k, v in consts:
        text += f"  using {k} = {v};\n" if isinstance(v, str) else f"  constexpr int {k} = {v};\n"
    return text + header_src + "\n}\n"


_UNDEF = "".join(f"#undef {n}\n#undef {n}_shape\n#undef {n}_strides\n"
                 for n in dict.fromkeys(src.PARTIAL_INPUTS + src.COMBINE_INPUTS + ["cnt", "out", "VQ_TNEW", "tok", "VQ_STARTS",
                                                       "rstart"]))
PAIRS = [(0, 0, 4, 1, 4, 1), (1, 1, 2, 2, 3, 2), (3, 3, 3, 1, 2, 1), (2, 2, 1, 1, 1, 1), (4, 4, 2, 1, 5, 1),
         (5, 5, 4, 1, 8, 1), (0, 4, 3, 1, 2, 1)]


def _ragged_partial(be: str, kernel) -> str:
    """The ragged KIVI partial (VQ_RAGGED: accelerated/cache/ragged.py; row starts, scalar loop), without and with a
    window, as `kernel` (the backend's wrapper) writes it."""
    half = "__half" if be == "cuda" else "half"
    body = "#undef VQ_KGROW\n#undef VQ_RAGGED\n"
    for haswin in (False, True):
        _, partial = src.assemble("partial", be, 4, 4, haswin, False, False, False, True, True)
        types = dict(q=half, kc1="uint32_t", kc2="uint32_t", vc1="uint32_t", vc2="uint32_t", kgs=half, kgz=half,
                     vgs=half, vgz=half, kw=half, vw=half, flags="uint32_t", nenc="int32_t", rstart="int32_t",
                     rphase="int32_t", out=half)
        body += kernel(f"partial_ragged_{int(haswin)}", partial,
                       src.inputs("partial", 4, 4, haswin, False, False, True, True), src.PARTIAL_OUTPUTS, types,
                       [("MK", 4), ("MV", 4), ("KB1", 2), ("KB2", 1), ("VB1", 2), ("VB2", 1), ("D", 128), ("QB", 4),
                        ("NT", 128), ("P", 16), ("KG", 32), ("VG", 32), ("CAUSAL", 0), ("HASWIN", int(haswin)),
                        ("U", 2), ("PF", 1), ("FUSED", 0), ("APPEND", 0), ("OT", half), ("RW", 8 * int(haswin))])
        body += ("#undef cnt\n#undef out\n" if be == "cuda" else "") + _UNDEF + "#undef rphase\n#undef VQ_KGROW\n" \
            "#undef VQ_RAGGED\n"
    return body


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_sources_compile(tmp_path):
    header, combine = src.assemble("combine", "cuda")
    body, names = "", []
    for i, (mk, mv, kb1, kb2, vb1, vb2) in enumerate(PAIRS):
        for d, qb, dt in [(128, 4, "__half"), (64, 2, "__nv_bfloat16"), (1024, 1, "float"), (16, 4, "__half")]:
            fused = d != 64                      # the combine inside the partial launch (CUDA's), and not
            _, partial = src.assemble("partial", "cuda", mk, mv, True, fused)
            p = min(32, d // 8)
            g = lambda m: "__half" if m == 4 else dt   # noqa: E731  kivi: float16 scale/zero
            types = dict(q=dt, kc1="uint32_t", kc2="uint32_t", vc1="uint32_t", vc2="uint32_t", kgs=g(mk),
                         kgz=g(mk), vgs=g(mv), vgz=g(mv), kw=dt, vw=dt, flags="uint32_t", nenc="int32_t",
                         cnt="int32_t", out=dt)
            name = f"partial_{i}_{d}"
            names.append(name)
            body += _kernel(name, partial, src.inputs("partial", mk, mv, True, fused),
                            src.FUSED_OUTPUTS if fused else src.PARTIAL_OUTPUTS, types,
                            [("MK", mk), ("MV", mv), ("KB1", kb1), ("KB2", kb2), ("VB1", vb1), ("VB2", vb2),
                             ("D", d), ("QB", qb), ("NT", 128), ("P", p), ("KG", 32), ("VG", 32), ("CAUSAL", 1),
                             ("HASWIN", 1), ("U", 2 if {mk, mv} & {4, 5} else 4), ("PF", 1),
                             ("FUSED", int(fused)), ("APPEND", 0), ("OT", dt)])
            body += "#undef cnt\n#undef out\n"       # the unfused partial's aliases
            body += _kernel(f"combine_{i}_{d}", combine, src.inputs("combine"), src.COMBINE_OUTPUTS,
                            dict(q=dt, out=dt), [("MV", mv), ("D", d), ("CNT", max(d, 512)), ("OT", dt)])
            body += _UNDEF           # MLX compiles each kernel alone; here they share one file
    body += _ragged_partial("cuda", _kernel)
    names += ["partial_ragged_0", "partial_ragged_1"]
    # the combine after an APPEND partial: its summary of the token (COMBINE_SUMMARY)
    _, combine_a = src.assemble("combine", "cuda", append=True)
    body += _kernel("combine_append", combine_a, src.inputs("combine", append=True), src.COMBINE_APPEND_OUTPUTS,
                    dict(q="__half", out="__half", tok="bool", summary="bool"),
                    [("MV", 0), ("D", 128), ("CNT", 512), ("OT", "__half")]) + _UNDEF
    csrc = commit.PRELUDES["cuda"] + commit.body((("uint32_t", 4), ("float", 3)), (("nonfinite", 4), ("flag", 2)))
    body += _kernel("commit", csrc, ["w0d", "w0s", "w1d", "w1s", "c0", "c1"], ["out"],
                    dict(w0d="uint32_t", w0s="uint32_t", w1d="float", w1s="float", c0="__half", c1="uint32_t",
                         out="uint32_t"), [])
    text = (CUDA_UNIT_PRELUDE + header
            + "namespace mlx::core::cu {\n" + body + "}\n")
    cu = tmp_path / "attention.cu"
    cu.write_text(text)
    r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", "-cubin", str(cu), "-o",
                        str(tmp_path / "attention.cubin")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    stats = {}
    for entry in r.stderr.split("Compiling entry function '")[1:]:
        m = re.search(r"(partial_(?:\d+_\d+|ragged_\d))", entry.split("'")[0])
        spill = re.search(r"(\d+) bytes spill stores", entry)
        if m and spill:
            stats[m.group(1)] = int(spill.group(1))
    assert set(stats) == set(names), sorted(set(names) - set(stats))
    assert stats["partial_0_128"] == 0, stats    # turboquant b4 keys and values, d = 128: no spills
    assert stats["partial_ragged_0"] == stats["partial_ragged_1"] == 0, stats   # ragged KIVI b2, d = 128


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_tensor_core_partial_compiles_without_spills(tmp_path):
    """The tensor-core partial kernel (attention_tc.py) as attention.py launches it: turboquant 4-bit keys and values,
    no window, fused combine, launch bounds of tc_min_blocks threadgroups; for sm_80 (mma.m16n8k16's first
    architecture) and sm_90. Spills in its loop would undo what it is for."""
    header, partial = src.assemble("partial", "cuda", 0, 0, False, True, True)
    body, names = "", []
    for d, qb, dt, causal in [(128, 4, "__half", 0), (128, 1, "__nv_bfloat16", 1), (64, 2, "float", 1)]:
        types = dict(q=dt, kc1="uint32_t", kc2="uint32_t", vc1="uint32_t", vc2="uint32_t", kgs=dt, kgz=dt, vgs=dt,
                     vgz=dt, kw=dt, vw=dt, flags="uint32_t", nenc="int32_t", cnt="int32_t", out=dt)
        name = f"partial_tc_{d}_{qb}"
        names.append(name)
        body += _kernel(name, partial, src.inputs("partial", 0, 0, False, True), src.FUSED_OUTPUTS, types,
                        [("MK", 0), ("MV", 0), ("KB1", 4), ("KB2", 1), ("VB1", 4), ("VB2", 1), ("D", d), ("QB", qb),
                         ("NT", tuning.DEFAULT.partial_threads), ("P", min(32, d // 8)), ("KG", 1), ("VG", 1), ("CAUSAL", causal),
                         ("HASWIN", 0), ("PF", tuning.DEFAULT.tc_prefetch), ("FUSED", 1), ("APPEND", 0), ("OT", dt)])
        body += _UNDEF
    # tc_codes: rabitq and 1- / 2-bit turboquant codes (combine launched, as a decode step runs it)
    for mk, mv, kb, vb, d in [(2, 2, 1, 1, 128), (0, 2, 2, 1, 128), (0, 0, 4, 2, 64), (2, 0, 1, 1, 128)]:
        _, partial = src.assemble("partial", "cuda", mk, mv, False, False, True)
        dt = "__half"
        types = dict(q=dt, kc1="uint32_t", vc1="uint32_t", ks0="float", ks1="float", vs0="float", vs1="float",
                     flags="uint32_t", nenc="int32_t")
        name = f"partial_tc_{d}_{mk}{mv}{kb}{vb}"
        names.append(name)
        body += _kernel(name, partial, src.inputs("partial", mk, mv, False, False), src.PARTIAL_OUTPUTS, types,
                        [("MK", mk), ("MV", mv), ("KB1", kb), ("KB2", 1), ("VB1", vb), ("VB2", 1), ("D", d), ("QB", 4),
                         ("NT", tuning.DEFAULT.partial_threads), ("P", min(32, d // 8)), ("KG", 1), ("VG", 1), ("CAUSAL", 0),
                         ("HASWIN", 0), ("PF", tuning.DEFAULT.tc_prefetch), ("FUSED", 0), ("APPEND", 0), ("OT", dt)])
        body += _UNDEF
    for arch, spills in _local_memory(header, body, tmp_path / "attention_tc", r"partial_tc_\d+_\d+").items():
        assert set(spills) == set(names), (arch, spills)
        assert not any(spills.values()), (arch, spills)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_3bit_tensor_core_partial_compiles_without_spills(tmp_path):
    """The tensor-core partial with a role of 3-bit codes (tuning's tc_3bit, csrc/tc_tens_*.cuh: raw words realigned
    per use, their indices constant after unrolling) as attention.py would launch it, the other role 1- to 4-bit
    turboquant or rabitq, d = 128 and 64, combine launched and fused; sm_80 and sm_90 without local memory."""
    body, names = "", []
    for mk, mv, kb, vb, d, fused in [(0, 0, 3, 3, 128, 0), (0, 0, 3, 2, 128, 0), (0, 0, 4, 3, 128, 1),
                                     (0, 2, 3, 1, 128, 0), (2, 0, 1, 3, 128, 0), (0, 0, 3, 3, 64, 0),
                                     (0, 0, 2, 3, 64, 0)]:
        header, partial = src.assemble("partial", "cuda", mk, mv, False, bool(fused), src.TC_TENS)
        dt = "__half"
        types = dict(q=dt, kc1="uint32_t", vc1="uint32_t", ks0="float", ks1="float", vs0="float", vs1="float",
                     flags="uint32_t", nenc="int32_t", cnt="int32_t", out=dt)
        name = f"partial_tc_{d}_{mk}{mv}{kb}{vb}{fused}"
        names.append(name)
        body += _kernel(name, partial, src.inputs("partial", mk, mv, False, bool(fused)),
                        src.FUSED_OUTPUTS if fused else src.PARTIAL_OUTPUTS, types,
                        [("MK", mk), ("MV", mv), ("KB1", kb), ("KB2", 1), ("VB1", vb), ("VB2", 1), ("D", d), ("QB", 4),
                         ("NT", tuning.DEFAULT.partial_threads), ("P", min(32, d // 8)), ("KG", 1), ("VG", 1), ("CAUSAL", 0),
                         ("HASWIN", 0), ("PF", tuning.DEFAULT.tc_prefetch), ("FUSED", fused), ("APPEND", 0), ("OT", dt)])
        body += _UNDEF
    for arch, spills in _local_memory(header, body, tmp_path / "attention_tc3", r"partial_tc_\d+_\d+").items():
        assert set(spills) == set(names), (arch, spills)
        assert not any(spills.values()), (arch, spills)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_kivi_tensor_core_partial_compiles_without_spills(tmp_path):
    """The KIVI tensor-core partial (tuning's tc_kivi, csrc/tc_kivi_loop.cuh) as attention.py would launch it:
    2- and 4-bit codes, a window, combine launched; sm_80 and sm_90, launch bounds as the turboquant loop's; a warp's
    chunks one at a time (KP 1) and two of a key group in a row (KP 2, tuning's tc_kpairs)."""
    header, partial = src.assemble("partial", "cuda", 4, 4, True, False, True)
    body, names = "", []
    for kb, vb, d, g, kp in [(2, 2, 128, 32, 1), (4, 4, 128, 128, 1), (4, 2, 64, 16, 1), (4, 4, 128, 32, 2),
                             (2, 2, 128, 128, 2)]:
        dt = "__half"
        types = dict(q=dt, kc1="uint32_t", vc1="uint32_t", kgs=dt, kgz=dt, vgs=dt, vgz=dt, kw=dt, vw=dt,
                     flags="uint32_t", nenc="int32_t")
        name = f"partial_tck_{d}_{kb}{vb}_{kp}"
        names.append(name)
        body += _kernel(name, partial, src.inputs("partial", 4, 4, True, False), src.PARTIAL_OUTPUTS, types,
                        [("MK", 4), ("MV", 4), ("KB1", kb), ("KB2", 1), ("VB1", vb), ("VB2", 1), ("D", d), ("QB", 4),
                         ("NT", tuning.DEFAULT.partial_threads), ("P", min(32, d // 8)), ("KG", g), ("VG", g),
                         ("CAUSAL", 0), ("HASWIN", 1), ("PF", tuning.DEFAULT.tc_prefetch), ("FUSED", 0), ("APPEND", 0),
                         ("OT", dt), ("KP", kp)])
        body += _UNDEF
    for arch, spills in _local_memory(header, body, tmp_path / "attention_tck", r"partial_tck_\d+_\d+_\d").items():
        assert set(spills) == set(names), (arch, spills)
        assert not any(spills.values()), (arch, spills)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_affine_tensor_core_partial_compiles_without_spills(tmp_path):
    """The mlx_affine tensor-core partial (tuning's tc_affine, csrc/tc_affine_loop.cuh) as attention.py would launch
    it: 2-, 4- and 8-bit codes, float16, bfloat16 and float32 records (one or two mmas per step), a window, combine
    launched; sm_80 and sm_90, launch bounds as the turboquant loop's."""
    header, partial = src.assemble("partial", "cuda", 5, 5, True, False, True)
    body, names = "", []
    for kb, vb, d, g, dt in [(4, 4, 128, 64, "__half"), (2, 2, 128, 32, "__half"), (8, 8, 128, 32, "__half"),
                             (4, 2, 64, 32, "__nv_bfloat16"), (4, 4, 128, 64, "float")]:
        types = dict(q="__half", kc1="uint32_t", vc1="uint32_t", kgs=dt, kgz=dt, vgs=dt, vgz=dt, kw=dt, vw=dt,
                     flags="uint32_t", nenc="int32_t")
        name = f"partial_tca_{d}_{kb}{vb}_{len(names)}"
        names.append(name)
        body += _kernel(name, partial, src.inputs("partial", 5, 5, True, False), src.PARTIAL_OUTPUTS, types,
                        [("MK", 5), ("MV", 5), ("KB1", kb), ("KB2", 1), ("VB1", vb), ("VB2", 1), ("D", d), ("QB", 4),
                         ("NT", tuning.DEFAULT.partial_threads), ("P", min(32, d // 8)), ("KG", g), ("VG", g),
                         ("CAUSAL", 0), ("HASWIN", 1), ("PF", tuning.DEFAULT.tc_prefetch), ("FUSED", 0), ("APPEND", 0),
                         ("OT", "__half")])
        body += _UNDEF
    for arch, spills in _local_memory(header, body, tmp_path / "attention_tca", r"partial_tca_\d+_\d+_\d+").items():
        assert set(spills) == set(names), (arch, spills)
        assert not any(spills.values()), (arch, spills)


def _local_memory(header: str, body: str, stem, entry: str, bounds: bool = True) -> dict:
    """{arch: {kernel: local memory in bytes (stack frame + spill stores)}} of kernels compiled for sm_80 and sm_90,
    with `bounds` as the tensor-core partial is (launch bounds of tc_min_blocks threadgroups of partial_threads threads), else as
    the scalar partial is (none); `entry`: a regex of the kernels' names. A stack frame is local memory too: a
    register array indexed at run time (rabitq's value words through vsh, 2026-12-01: 60 local loads per chunk),
    a loop over one left rolled (turboquant_prod's values loop) or the IEEE division's slow-path call."""
    from veloxquant.accelerated.kernels import attention as katt
    text = (CUDA_UNIT_PRELUDE + header
            + (katt._bounds(tuning.DEFAULT.partial_threads, tuning.DEFAULT.tc_min_blocks) if bounds else "")
            + "namespace mlx::core::cu {\n" + body + "}\n")
    return {arch: {m.group(1): int(m.group(2)) + int(m.group(3)) for m in re.finditer(
        rf"Compiling entry function '[^']*({entry})[^']*'.*?(\d+) bytes stack frame, (\d+) bytes spill stores",
        log, re.S)} for arch, log in ptxas(text, stem).items()}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_partial_with_the_append_inside_compiles(tmp_path):
    """The partial kernel with the decode step's append inside (APPEND, attention_source.append_block) as a decode
    step launches it: the tensor-core loop (turboquant b4, sm_80 and sm_90, no spills: the encode body must not
    cost the loop registers) and the scalar loop for the other per-token pairs, float16 and bfloat16 inputs."""
    # (the last two with row starts: a left-padded batch's decode step, accelerated/cache/batch_shared.py)
    variants = [(0, 0, 4, 1, 4, 1, True, "__half", False), (0, 0, 4, 1, 4, 1, True, "__nv_bfloat16", False),
                (1, 3, 3, 2, 2, 1, False, "__half", False), (2, 5, 1, 1, 4, 1, False, "__nv_bfloat16", False),
                (3, 2, 3, 1, 1, 1, False, "__half", False), (0, 0, 4, 1, 4, 1, True, "__half", True),
                (2, 2, 1, 1, 1, 1, False, "__half", True)]
    header, body, names = "", "", []
    for i, (mk, mv, kb1, kb2, vb1, vb2, tc, dt, starts) in enumerate(variants):
        h, partial = src.assemble("partial", "cuda", mk, mv, False, False, tc, True, starts)
        header = h if tc else header
        ts = lambda m: "float" if dt == "float" else dt   # noqa: E731  the side dtype of a record (norm, scales)
        types = dict(q=dt, kc1="uint32_t", kc2="uint32_t", vc1="uint32_t", vc2="uint32_t", ks0=ts(mk), ks1=ts(mk),
                     vs0=ts(mv), vs1=ts(mv), kgs=ts(mk), kgz=ts(mk), vgs=ts(mv), vgz=ts(mv), flags="bool",
                     nenc="int32_t", kx=dt, vx=dt, kconst="uint32_t", vconst="uint32_t", token="bool", rstart="int32_t")
        name = f"partial_append_{i}"
        names.append((name, tc))
        tmpl = [("MK", mk), ("MV", mv), ("KB1", kb1), ("KB2", kb2), ("VB1", vb1), ("VB2", vb2), ("D", 128), ("QB", 4),
                ("NT", tuning.DEFAULT.partial_threads), ("P", 16), ("KG", 1 if mk != 5 else 64), ("VG", 1 if mv != 5 else 64), ("CAUSAL", 0),
                ("HASWIN", 0)] + ([] if tc else [("U", 4)]) + [("PF", tuning.DEFAULT.tc_prefetch if tc else 1), ("FUSED", 0),
                                                               ("APPEND", 1), ("OT", dt), ("KTS", dt), ("VTS", dt)]
        tmpl += [(f"{r}C{n}", c) for r, m, b1, b2 in (("K", mk, kb1, kb2), ("V", mv, vb1, vb2))
                 for n, c in zip(("B1", "B2", "GS"), (b1, b2, 64 if m == 5 else 1))]
        body += _kernel(name, partial, src.inputs("partial", mk, mv, False, False, True, starts), src.APPEND_OUTPUTS,
                        types, tmpl)
        body += _UNDEF
    for arch, spills in _local_memory(header, body, tmp_path / "attention_append", r"partial_append_\d+").items():
        assert set(spills) == {n for n, _ in names}, (arch, spills)
        assert not any(spills[n] for n, tc in names if tc), (arch, spills)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_ragged_partial_with_the_append_inside_compiles(tmp_path):
    """The ragged KIVI partial (VQ_RAGGED, accelerated/cache/ragged.py) with the decode step's append inside (each
    row flushing its group at its own step: attention_source.append_block's ragged scopes), KIVI 2-bit both roles
    with a window, as a ragged decode step would launch it: compiles for sm_80 and sm_90 without spills."""
    from veloxquant import spec
    from veloxquant.accelerated.kernels import methods as km
    header, partial = src.assemble("partial", "cuda", 4, 4, True, False, False, True, True, True)
    dt = "__half"
    types = dict(q=dt, kc1="uint32_t", vc1="uint32_t", kgs=dt, kgz=dt, vgs=dt, vgz=dt, kw=dt, vw=dt, kx=dt, vx=dt,
                 kf=dt, vf=dt, kconst="uint32_t", vconst="uint32_t", flags="bool", nenc="int32_t", rstart="int32_t",
                 rphase="int32_t", token="bool")
    tmpl = [("MK", 4), ("MV", 4), ("KB1", 2), ("KB2", 1), ("VB1", 2), ("VB2", 1), ("D", 128), ("QB", 4),
            ("NT", tuning.DEFAULT.partial_threads), ("P", 16), ("KG", 32), ("VG", 32), ("CAUSAL", 0), ("HASWIN", 1),
            ("U", 2), ("PF", 1), ("FUSED", 0), ("APPEND", 1), ("OT", dt), ("RW", 8), ("KTS", dt), ("VTS", dt),
            ("KXT", dt), ("VXT", dt)]
    for r in "KV":
        p = spec.Params("kivi", bits=2, group_size=32, window=8, role=r.lower()).resolved()
        tmpl += [(f"{r}C{n}", c) for n, c in zip(("B1", "B2", "GS"), km.code_constants(p))]
    body = _kernel("partial_ragged_append", partial, src.inputs("partial", 4, 4, True, False, True, True, True),
                   src.APPEND_OUTPUTS, types, tmpl) + _UNDEF
    for arch, spills in _local_memory(header, body, tmp_path / "attention_ragged", r"partial_ragged_append").items():
        assert set(spills) == {"partial_ragged_append"} and not any(spills.values()), (arch, spills)


def test_cold_loops_knob_reaches_the_cuda_header(monkeypatch, tune):
    """tuning's cold_loops: the CUDA launch's header defines VQ_COLD as `#pragma unroll 1` (and only then); the
    bodies mark their once-per-threadgroup loops with it, and the shared helpers default it to nothing."""
    from veloxquant.accelerated.kernels import attention as katt
    from veloxquant.accelerated.kernels import backend
    seen = []
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("cuda", "recorded"))
    monkeypatch.setattr(backend, "available", lambda: (True, "recorded"))
    monkeypatch.setattr(backend, "cuda_kernel", lambda **kw: seen.append(kw["header"]) or object())
    cold = '#define VQ_COLD _Pragma("unroll 1")'
    for on in (False, True):
        tune(cold_loops=on)
        katt._compiled.cache_clear()
        katt._kernel("partial", 0, 0, False, True, True)
        assert (cold in seen[-1]) is on, f"cold_loops={on}: header {'lacks' if on else 'has'} the VQ_COLD pragma"
    katt._compiled.cache_clear()
    assert "#ifndef VQ_COLD\n#define VQ_COLD\n#endif" in src.HELPERS
    body = src.PARTIAL_TC_BODY
    assert body.count("VQ_COLD\n") >= 10, body.count("VQ_COLD\n")


def test_window_prefetch_knob_reaches_the_cuda_header(monkeypatch, tune):
    """tuning's tc_window_prefetch: the CUDA launch's header defines VQ_WPF (csrc/tc_window.h) for a tensor-core
    partial with a window only, under a name of its own (the defaults' kernels keep their names and texts)."""
    from veloxquant.accelerated.kernels import attention as katt
    seen = recorded_cuda_kernels(monkeypatch)
    for on in (False, True):
        tune(tc_window_prefetch=on)
        for haswin, tc in ((True, True), (False, True), (True, False)):
            katt._compiled.cache_clear()
            katt._kernel("partial", 4, 4, haswin, False, tc)
            name, header = seen[-1]
            want = on and haswin and tc
            assert ("#define VQ_WPF 1" in header) is want and name.endswith("_wpf") is want, (on, haswin, tc, name)
    katt._compiled.cache_clear()


def recorded_cuda_kernels(monkeypatch) -> list:
    """The CUDA backend stood in for: each kernel object attention.py makes is recorded as (name, header) in the list
    returned, none compiled (which knobs reach which kernels' texts)."""
    from veloxquant.accelerated.kernels import backend
    seen: list = []
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("cuda", "recorded"))
    monkeypatch.setattr(backend, "available", lambda: (True, "recorded"))
    monkeypatch.setattr(backend, "cuda_kernel", lambda **kw: seen.append((kw["name"], kw["header"])) or object())
    return seen


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_window_prefetch_compiles_without_spills(tmp_path, monkeypatch):
    """The tensor-core partials with a window whose split loads ahead (VQ_WPF) as a decode step launches them (their
    templates from attention._static): turboquant b4 and KIVI 2 / 4 bits, the append inside or not, sm_80 and sm_90,
    no local memory (the next token's rows beside the loop's registers)."""
    import mlx.core as mx

    from veloxquant import spec
    from veloxquant.accelerated.kernels import attention as katt
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 132)
    cuda = {mx.float16: "__half", mx.float32: "float"}
    f16 = mx.float16
    for i, (method, bits, g, append) in enumerate([("turboquant", 4, 0, False), ("turboquant", 4, 0, True),
                                                    ("kivi", 4, 32, False), ("kivi", 2, 32, True)]):
        kp, vp = (spec.Params(method, bits=bits, window=8, role=r, **(dict(group_size=g) if g else {})).resolved()
                  for r in "kv")
        side = f16 if method == "kivi" else mx.float32
        st = katt._static(kp, vp, 1, 32, 1, 128, 8, 16, True, False, f16, 128 ** -0.5, False, 16, tuning.DEFAULT,
                          (side, side, f16, f16) if append else None)
        katt._static.cache_clear()
        assert st.key[4] is True, st.key
        header, partial = src.assemble("partial", "cuda", st.key[0], st.key[1], True, False, True, append)
        dt = "__half"
        types = dict(q=dt, kc1="uint32_t", kc2="uint32_t", vc1="uint32_t", vc2="uint32_t", ks0="float", ks1="float",
                     vs0="float", vs1="float", kgs=dt, kgz=dt, vgs=dt, vgz=dt, kw=dt, vw=dt, kf=dt, vf=dt, kx=dt,
                     vx=dt, kconst="uint32_t", vconst="uint32_t", flags="bool" if append else "uint32_t",
                     nenc="int32_t", token="bool")
        name = f"partial_wpf_{i}"     # (one translation unit each, as MLX compiles them)
        tmpl = [(n, cuda.get(v, v)) for n, v in st.template]
        outs = src.APPEND_OUTPUTS if append else src.PARTIAL_OUTPUTS
        body = _kernel(name, partial, st.names, outs, types, tmpl)
        for arch, spills in _local_memory("#define VQ_WPF 1\n" + header, body, tmp_path / name, name).items():
            assert set(spills) == {name} and not spills[name], (method, bits, append, arch, spills)


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("readelf") is None,
                    reason="nvcc / readelf not installed: CUDA code-size check skipped")
def test_cold_loops_make_the_tensor_core_partial_smaller(tmp_path):
    """With VQ_COLD = `#pragma unroll 1` the tensor-core partial (d = 128, 4 rows, fused combine) compiles for sm_90
    without spills into less code (measured 2026-12-01: 112,640 -> 76,288 bytes of .text)."""
    from veloxquant.accelerated.kernels import attention as katt
    header, partial = src.assemble("partial", "cuda", 0, 0, False, True, True)
    dt = "__half"
    types = dict(q=dt, kc1="uint32_t", kc2="uint32_t", vc1="uint32_t", vc2="uint32_t", kgs=dt, kgz=dt, vgs=dt,
                 vgz=dt, kw=dt, vw=dt, flags="uint32_t", nenc="int32_t", cnt="int32_t", out=dt)
    body = _kernel("partial_tc", partial, src.inputs("partial", 0, 0, False, True), src.FUSED_OUTPUTS, types,
                   [("MK", 0), ("MV", 0), ("KB1", 4), ("KB2", 1), ("VB1", 4), ("VB2", 1), ("D", 128), ("QB", 4),
                    ("NT", tuning.DEFAULT.partial_threads), ("P", 16), ("KG", 1), ("VG", 1), ("CAUSAL", 0), ("HASWIN", 0),
                    ("PF", tuning.DEFAULT.tc_prefetch), ("FUSED", 1), ("APPEND", 0), ("OT", dt)]) + _UNDEF
    sizes = {}
    for cold in (False, True):
        text = (CUDA_UNIT_PRELUDE
                + ('#define VQ_COLD _Pragma("unroll 1")\n' if cold else "") + header
                + katt._bounds(tuning.DEFAULT.partial_threads, tuning.DEFAULT.tc_min_blocks) + "namespace mlx::core::cu {\n" + body + "}\n")
        cu, cubin = tmp_path / f"tc_{cold}.cu", tmp_path / f"tc_{cold}.cubin"
        cu.write_text(text)
        r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", "-cubin", str(cu), "-o", str(cubin)],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        assert re.search(r"0 bytes spill stores", r.stderr), (cold, r.stderr[-1500:])
        sec = subprocess.run(["readelf", "-S", "-W", str(cubin)], capture_output=True, text=True).stdout
        sizes[cold] = max(int(m.group(1), 16) for m in re.finditer(r"\.text\.\S+\s+\S+\s+\S+\s+\S+\s+([0-9a-f]+)", sec))
    assert sizes[True] < 0.8 * sizes[False], sizes


def _metal_kernel(name, text, ins, outs, types, consts):
    """Like mlx/backend/metal/custom_kernel.cpp: `const device T*` inputs with `constant` shapes and strides where the
    source names them, `device T*` outputs, the thread-position attributes the source names; the template
    arguments as constants at the top (MLX makes them template parameters: the same names in the body)."""
    import test_kernels_source as tks
    params = tks.metal_params([(n, types.get(n, "float"), "device") for n in ins],
                              [(n, types.get(n, "float")) for n in outs], text)
    head = "".join(f"  using {k} = {v};\n" if isinstance(v, str) else f"  constexpr int {k} = {v};\n" for k, v in consts)
    return f"[[kernel]] void {name}(\n" + ",\n".join(params) + f") {{\n{head}{text}\n}}\n"


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: Metal shim compile skipped")
def test_metal_sources_compile_against_shim(tmp_path):
    """Every partial (the scalar loop: the tensor-core loop is CUDA's) and the combine launch, as Metal would get
    them, for each method pair and a few head dims and dtypes; shown to fail on a CUDA name in the combine body."""
    import test_kernels_source as tks
    header, combine = src.assemble("combine", "metal")

    def text_for(combine_text):
        body = ""
        for i, (mk, mv, kb1, kb2, vb1, vb2) in enumerate(PAIRS):
            for d, qb, dt in [(128, 4, "half"), (64, 2, "bfloat16_t"), (16, 4, "float")]:
                _, partial = src.assemble("partial", "metal", mk, mv, True, False)
                g = lambda m: "half" if m == 4 else dt   # noqa: E731  kivi: float16 scale/zero
                types = dict(q=dt, kc1="uint32_t", kc2="uint32_t", vc1="uint32_t", vc2="uint32_t", kgs=g(mk),
                             kgz=g(mk), vgs=g(mv), vgz=g(mv), kw=dt, vw=dt, flags="uint32_t", nenc="int32_t", out=dt)
                body += _metal_kernel(f"partial_{i}_{d}", partial, src.inputs("partial", mk, mv, True, False),
                                      src.PARTIAL_OUTPUTS, types,
                                      [("MK", mk), ("MV", mv), ("KB1", kb1), ("KB2", kb2), ("VB1", vb1), ("VB2", vb2),
                                       ("D", d), ("QB", qb), ("NT", 128), ("P", min(32, d // 8)), ("KG", 32),
                                       ("VG", 32), ("CAUSAL", 1), ("HASWIN", 1),
                                       ("U", 2 if {mk, mv} & {4, 5} else 4), ("PF", 1), ("FUSED", 0), ("APPEND", 0),
                                       ("OT", dt)])
                body += _UNDEF
                body += _metal_kernel(f"combine_{i}_{d}", combine_text, src.inputs("combine"), src.COMBINE_OUTPUTS,
                                      dict(q=dt, out=dt), [("MV", mv), ("D", d), ("CNT", max(d, 512)), ("OT", dt)])
                body += _UNDEF
            if 4 in (mk, mv):
                continue
            # the decode step's append inside the partial (APPEND): per-token pairs, no window
            starts = i % 2 == 0         # row starts (a left-padded batch) on every other pair
            _, partial = src.assemble("partial", "metal", mk, mv, False, False, False, True, starts)
            types = dict(q="half", kc1="uint32_t", kc2="uint32_t", vc1="uint32_t", vc2="uint32_t", ks0="float",
                         ks1="float", vs0="float", vs1="float", kgs="half", kgz="half", vgs="half", vgz="half",
                         flags="bool", nenc="int32_t", kx="half", vx="half", kconst="uint32_t", vconst="uint32_t",
                         token="bool", rstart="int32_t")
            body += _metal_kernel(f"partial_append_{i}", partial,
                                  src.inputs("partial", mk, mv, False, False, True, starts),
                                  src.APPEND_OUTPUTS, types,
                                  [("MK", mk), ("MV", mv), ("KB1", kb1), ("KB2", kb2), ("VB1", vb1), ("VB2", vb2),
                                   ("D", 128), ("QB", 4), ("NT", 128), ("P", 16), ("KG", 32), ("VG", 32), ("CAUSAL", 0),
                                   ("HASWIN", 0), ("U", 2 if 5 in (mk, mv) else 4), ("PF", 1), ("FUSED", 0),
                                   ("APPEND", 1), ("OT", "half"), ("KTS", "float" if mk != 5 else "half"),
                                   ("VTS", "float" if mv != 5 else "half"), ("KCB1", kb1), ("KCB2", kb2),
                                   ("KCGS", 32 if mk == 5 else 1), ("VCB1", vb1), ("VCB2", vb2),
                                   ("VCGS", 32 if mv == 5 else 1)])
            body += _UNDEF
        # the combine after an APPEND partial (its summary of the token)
        body += _metal_kernel("combine_append", "".join(src.assemble("combine", "metal", append=True)[1:]),
                              src.inputs("combine", append=True), src.COMBINE_APPEND_OUTPUTS,
                              dict(q="half", out="half", tok="bool", summary="bool"),
                              [("MV", 0), ("D", 128), ("CNT", 512), ("OT", "half")]) + _UNDEF
        return header + src.encode_macros("metal")[0] + body

    r = tks._gxx_metal(text_for(combine), tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    broken = combine.replace("  BARRIER();\n", "  __syncthreads();\n", 1)
    assert broken != combine
    assert tks._gxx_metal(text_for(broken), tmp_path).returncode != 0, "the shim compile took a CUDA name"


@pytest.mark.parametrize("kernel", ["append-serial", "append-apart", "partial-append"])
def test_encode_scopes_declare_threadgroup_memory_at_kernel_scope(kernel):
    """Metal takes threadgroup memory at kernel scope only: the append kernel's and the APPEND partial's copies of
    the encode body bind pointers to arrays the kernel declares (append.encode_shared); the lint of
    tests/test_kernels_source.py finds any SHARED inside a block (shown to fail on the body's own declarations
    placed in a scope)."""
    import test_kernels_source as tks
    from veloxquant.accelerated.kernels import append as kapp
    from veloxquant.accelerated.kernels import source
    if kernel == "partial-append":
        text = src.assemble("partial", "metal", 0, 5, False, False, False, True)[1]
    else:
        text = kapp.assemble("metal", "turboquant", "mlx_affine", kernel.endswith("apart"))[1]
    rule = "SHARED inside a block"
    assert not [b for b in tks.metal_rule_violations(text) if b.startswith(rule)], kernel
    assert [b for b in tks.metal_rule_violations("{\n" + source.ENCODE_BODY + "}\n") if b.startswith(rule)]


def test_metal_partials_declare_threadgroup_memory_at_kernel_scope():
    """Every partial Metal compiles (the scalar loop, every method pair, with and without a window) keeps its
    threadgroup arrays at kernel scope, the fused combine's dead branch included."""
    import test_kernels_source as tks
    for mk, mv, *_ in PAIRS:
        for haswin in (False, True):
            text = src.assemble("partial", "metal", mk, mv, haswin, False)[1]
            bad = [b for b in tks.metal_rule_violations(text) if b.startswith("SHARED inside a block")]
            assert not bad, (mk, mv, haswin, bad)


_ADDRESS_SPACE = r"(?:device|threadgroup|constant|thread)"
_POINTER_DECL = re.compile(r"(?<![\w<])((?:const\s+)?(?:" + _ADDRESS_SPACE + r"\s+)?(?:const\s+)?[A-Za-z_][\w:]*"
                           r"(?:<[^<>;]*>)?\s*\*+\s*(?:const\s+)?[A-Za-z_]\w*\s*=)")


def _pointers_without_address_space(text: str) -> list[str]:
    """Pointer declarations of the text after its own macros are expanded (g++ -E) that name no Metal address
    space: the shim compile cannot see these (its address-space keywords expand to nothing)."""
    r = subprocess.run(["g++", "-E", "-P", "-x", "c++", "-"], input=text, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return [m.group(1) for m in _POINTER_DECL.finditer(r.stdout) if not re.search(_ADDRESS_SPACE, m.group(1))]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no preprocessor for the Metal texts")
def test_metal_pointer_declarations_name_an_address_space():
    """Every Metal kernel text we ship, macros expanded: the encode and decode kernels, the append kernel in both
    layouts, every scalar partial pair with and without a window, the APPEND partials, the combine. Shown to fail
    with the append scopes' threadgroup pointers left without `threadgroup`."""
    from veloxquant.accelerated.kernels import append as kapp
    from veloxquant.accelerated.kernels import source
    names = {v: k for k, v in src.METHOD_IDS.items()}
    texts = {kind: "".join(source.assemble(kind, "metal")) for kind in ("encode", "decode")}
    texts["combine"] = "".join(src.assemble("combine", "metal"))
    texts["combine-append"] = "".join(src.assemble("combine", "metal", append=True))
    for mk, mv, *_ in PAIRS:
        for haswin in (False, True):
            texts[f"partial {mk}{mv}{int(haswin)}"] = "".join(src.assemble("partial", "metal", mk, mv, haswin, False))
        if 4 not in (mk, mv):
            texts[f"partial-append {mk}{mv}"] = "".join(src.assemble("partial", "metal", mk, mv, False, False, False,
                                                                     True))
            for apart in (False, True):
                texts[f"append {mk}{mv}{int(apart)}"] = "".join(kapp.assemble("metal", names[mk], names[mv], apart))
    bad = {n: b for n, t in texts.items() if (b := _pointers_without_address_space(t))}
    assert not bad, bad
    broken = texts["append 000"].replace("#define VQ_TG threadgroup", "#define VQ_TG")
    assert broken != texts["append 000"] and _pointers_without_address_space(broken)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_scalar_partial_of_turboquant_prod_b4_keeps_to_registers(tmp_path):
    """The scalar partial for turboquant_prod b4 keys and values (3 + 1 bits, d = 128, 4 query rows, U = 4 as
    attention.py launches it), sm_80 and sm_90: no local memory. Its values loop over the U token slots was left rolled by
    nvcc (a long body), which put tu[u] and w[u][r] in an 80-byte stack frame (VQ_UNROLL; shown to fail without)."""
    header, partial = src.assemble("partial", "cuda", 3, 3, False, False)
    dt = "__half"
    types = dict(q=dt, kc1="uint32_t", kc2="uint32_t", vc1="uint32_t", vc2="uint32_t", ks0="float", ks1="float",
                 vs0="float", vs1="float", flags="bool", nenc="int32_t", out=dt)
    body = _kernel("partial_prod_b4", partial, src.inputs("partial", 3, 3, False, False), src.PARTIAL_OUTPUTS, types,
                   [("MK", 3), ("MV", 3), ("KB1", 3), ("KB2", 1), ("VB1", 3), ("VB2", 1), ("D", 128), ("QB", 4),
                    ("NT", tuning.DEFAULT.partial_threads), ("P", 16), ("KG", 1), ("VG", 1), ("CAUSAL", 0), ("HASWIN", 0), ("U", 4),
                    ("PF", tuning.DEFAULT.prefetch), ("FUSED", 0), ("APPEND", 0), ("OT", dt)]) + "#undef cnt\n#undef out\n"
    for arch, local in _local_memory(header, body, tmp_path / "prod", r"partial_prod_b4", bounds=False).items():
        assert local == {"partial_prod_b4": 0}, (arch, local)
