"""The exact windows passed whole (tuning's whole_windows: csrc/window_bind.h binds kf / kw / vf / vw to rows of each
window buffer from one small input, wrow) as a decode step launches them: every such kernel compiles with nvcc for
sm_80 and sm_90 without local memory where its views twin has none, and the Metal texts against the shim. What the
kernels compute with it: the emulated decode steps with the knob on (tests/test_mixed_step_emulated.py,
test_rotating_step_emulated.py: the scalar loop and the tensor-core loop's window split, test_window_step.py,
test_plan_growth.py); what a step builds: tests/test_step_nodes.py."""
from __future__ import annotations

import shutil

import mlx.core as mx
import pytest

from veloxquant import spec
from veloxquant.accelerated import tuning
from veloxquant.accelerated.kernels import append as fused
from veloxquant.accelerated.kernels import attention as katt
from _attention_util import CUDA_UNIT_PRELUDE, resources

src = katt.src
CUDA = {mx.float16: "__half", mx.float32: "float", mx.bfloat16: "__nv_bfloat16"}
# (name, keys (method, bits, G, R), values (...), tensor cores, the append inside)
PARTIALS = [("tq4-w8", ("turboquant", 4, 0, 8), ("turboquant", 4, 0, 8), True, False),
            ("tq4-w8-append", ("turboquant", 4, 0, 8), ("turboquant", 4, 0, 8), True, True),
            ("kivi2-w8-append", ("kivi", 2, 32, 8), ("kivi", 2, 32, 8), True, True),
            ("kivi4-w0-append", ("kivi", 4, 32, 0), ("kivi", 4, 32, 0), True, True),
            ("prod4-w8-append", ("turboquant_prod", 4, 0, 8), ("turboquant_prod", 4, 0, 8), True, True),
            ("tq3-kivi2-mixed-append", ("turboquant", 3, 0, 0), ("kivi", 2, 32, 8), True, True),
            ("tq4-w8-scalar-append", ("turboquant", 4, 0, 8), ("turboquant", 4, 0, 8), False, True),
            ("kivi4-tq4-mixed-scalar-append", ("kivi", 4, 32, 128), ("turboquant", 4, 0, 0), False, True),
            ("kivi2-w32-scalar", ("kivi", 2, 32, 32), ("kivi", 2, 32, 32), False, False)]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")


def _params(role: str, method: str, bits: int, g: int, r: int) -> spec.Params:
    return spec.Params(method, bits=bits, window=r, role=role, **(dict(group_size=g) if g else {})).resolved()


def _partial(case, whole: bool, monkeypatch) -> tuple[str, str]:
    """(header, one kernel's text as MLX builds it) of a decode step's partial launch, from attention._static."""
    from test_attention_kernels_source import _kernel
    _, kc, vc, tc, append = case
    kp, vp = _params("k", *kc), _params("v", *vc)
    monkeypatch.setattr(katt, "_mma_available", lambda: tc)
    monkeypatch.setattr(katt, "_sm_count", lambda: 132)
    mixed = fused.mixed(kp, vp)
    haswin = katt.mixed_windows(kp, vp) if mixed else True
    ts = [katt.km._side_dtype(p, mx.float16) for p in (kp, vp)]
    st = katt._static(kp, vp, 1, 32, 1, 128, 8, 16, haswin, False, mx.float16, 128 ** -0.5, False, 16,
                      tuning.DEFAULT, (*ts, mx.float16, mx.float16) if append else None)
    katt._static.cache_clear()
    st = katt._whole(st) if whole else st
    mk, mv, hw, fu, tcl, _, app, starts = st.key[:8]
    header, text = src.assemble("partial", "cuda", mk, mv, hw, fu, tcl, app, starts, False, whole)
    h = "__half"
    types = {n: "uint32_t" for n in ("kc1", "kc2", "vc1", "vc2", "kconst", "vconst")}
    types.update({n: h for n in ("q", "kw", "vw", "kf", "vf", "kx", "vx", "kwb", "vwb")})
    types.update({f"{r}{n}": CUDA[t] for r, t in zip("kv", ts) for n in ("s0", "s1", "gs", "gz")})
    types.update(flags="bool" if append else "uint32_t", nenc="int32_t", wrow="int32_t", token="bool")
    outs = src.APPEND_OUTPUTS if append else src.PARTIAL_OUTPUTS
    body = _kernel("partial_whole", text, st.names, outs, types, [(n, CUDA.get(v, v)) for n, v in st.template])
    bounds = katt._bounds(tuning.DEFAULT.partial_threads, tuning.DEFAULT.tc_min_blocks) if st.key[4] else ""
    return header + bounds, body


def _append(mk: str, mv: str, win, whole: bool) -> tuple[str, str]:
    """(header, text) of the append kernel for a windowed pair, as the decode step launches it (turboquant b4, KIVI
    b2 G 32: d = 128, 8 heads, one token, float16)."""
    from test_attention_kernels_source import _kernel
    kw, vw = fused._roles(win)
    kp = _params("k", mk, *((2, 32) if mk == "kivi" else (4, 0)), 8 if kw else 0)
    vp = _params("v", mv, *((2, 32) if mv == "kivi" else (4, 0)), 8 if vw else 0)
    side = [katt.km._side_dtype(p, mx.float16) for p in (kp, vp)]     # (fused._static_for's template)
    tmpl = [("KM", src.METHOD_IDS[mk]), ("VM", src.METHOD_IDS[mv]), ("D", 128), ("KTS", side[0]), ("VTS", side[1]),
            *fused.code_template(kp, vp, 8), *([("KXT", mx.float16)] if kw else []),
            *([("VXT", mx.float16)] if vw else [])]
    header, text = fused.assemble("cuda", mk, mv, True, win, False, whole)
    types = {n: "int32_t" for n in ("base", "vbase", "wrow")}
    types.update({n: "__half" for n in ("kx", "vx", "kf", "kw", "vf", "vw", "kwb", "vwb")}, after="bool",
                 kconst="uint32_t", vconst="uint32_t", kcodes1="uint32_t", kcodes2="uint32_t", vcodes1="uint32_t",
                 vcodes2="uint32_t", flags="bool")
    types.update({f"{r}{n}": CUDA[katt.km._side_dtype(p, mx.float16)] for r, p in (("k", kp), ("v", vp))
                  for n in ("f_s1", "f_s2")})
    return header, _kernel("append_whole", text, fused.inputs(mk, mv, win, False, whole), fused.OUTPUTS, types,
                           [(n, CUDA.get(v, v)) for n, v in tmpl])


def _unit(header: str, body: str) -> str:
    return CUDA_UNIT_PRELUDE + header + "namespace mlx::core::cu {\n" + body + "}\n"


@needs_nvcc
@pytest.mark.parametrize("case", PARTIALS, ids=[c[0] for c in PARTIALS])
def test_whole_window_partials_compile_without_local_memory(case, tmp_path, monkeypatch):
    """The partial with the windows whole: registers, stack and spills on sm_80 and sm_90 against its views twin; no
    local memory where the twin has none (the bound names are locals of constant index: registers)."""
    got = {w: resources(_unit(*_partial(case, w, monkeypatch)), tmp_path / f"p{int(w)}") for w in (False, True)}
    print(case[0], {w: {a: r[0] for a, r in got[w].items()} for w in got})     # registers (the report's)
    for arch, (regs, stack, spill, load) in got[True].items():
        twin = got[False][arch]
        assert stack + spill + load <= twin[1] + twin[2] + twin[3], (case[0], arch, got)


@needs_nvcc
@pytest.mark.parametrize("mk, mv, win", [("turboquant", "turboquant", True), ("kivi", "kivi", True),
                                         ("turboquant", "kivi", (False, True)), ("turboquant", "kivi", (True, True))])
def test_whole_window_appends_compile_without_local_memory(mk, mv, win, tmp_path):
    got = {w: resources(_unit(*_append(mk, mv, win, w)), tmp_path / f"a{int(w)}") for w in (False, True)}
    print(mk, mv, win, {w: {a: r[0] for a, r in got[w].items()} for w in got})
    for arch, (regs, stack, spill, load) in got[True].items():
        twin = got[False][arch]
        assert stack + spill + load <= twin[1] + twin[2] + twin[3], (mk, mv, win, arch, got)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: Metal shim compile skipped")
def test_whole_window_metal_texts_compile_against_the_shim(tmp_path):
    """The scalar partials with the windows whole (HASWIN 1, and MIXED 3 and 4 with the append inside) and the
    windowed appends (kernels/append.py), as Metal would get them, against tests/metal_shim.h; the binding within the Metal rules the shim
    cannot see (tests/test_kernels_source.py's lint: no pointer declarations, no raw float operators)."""
    import test_kernels_source as tks
    from test_attention_kernels_source import _metal_kernel
    from veloxquant.accelerated.kernels import loader
    bind = loader.text("window_bind.h")
    assert not tks.metal_rule_violations(bind) and not tks.float_op_violations(bind)
    header = src.assemble("partial", "metal")[0] + src.encode_macros("metal")[0]
    for i, (mk, mv, haswin, append) in enumerate([(0, 0, 1, False), (4, 4, 1, False), (0, 4, 3, True),
                                                  (0, 4, 4, True)]):
        _, text = src.assemble("partial", "metal", mk, mv, haswin, False, False, append, False, False, True)
        types = dict(q="half", kc1="uint32_t", kc2="uint32_t", vc1="uint32_t", vc2="uint32_t", ks0="float",
                     ks1="float", vs0="float", vs1="float", kgs="half", kgz="half", vgs="half", vgz="half", kwb="half",
                     vwb="half", wrow="int32_t", kx="half", vx="half", kconst="uint32_t", vconst="uint32_t",
                     flags="bool" if append else "uint32_t", nenc="int32_t", token="bool")
        consts = [("MK", mk), ("MV", mv), ("KB1", 3 if mk == 0 else 2), ("KB2", 1), ("VB1", 2), ("VB2", 1), ("D", 128),
                  ("QB", 4), ("NT", 128), ("P", 16), ("KG", 32 if mk == 4 else 1), ("VG", 32), ("CAUSAL", 0),
                  ("HASWIN", haswin), ("U", 2), ("PF", 1), ("FUSED", 0), ("APPEND", int(append)), ("OT", "half")]
        if append:
            consts += [("KTS", "float" if mk == 0 else "half"), ("VTS", "half"), ("KXT", "half"), ("VXT", "half")]
            consts += [(f"{r}C{n}", c) for r, b in (("K", 3 if mk == 0 else 2), ("V", 2))
                       for n, c in zip(("B1", "B2", "GS"), (b, 1, 32 if r == "V" or mk == 4 else 1))]
        body = _metal_kernel(f"partial_whole_{i}", text, src.inputs("partial", mk, mv, haswin, False, append, False,
                                                                    False, True),
                             src.APPEND_OUTPUTS if append else src.PARTIAL_OUTPUTS, types, consts)
        r = tks._gxx_metal(header + body, tmp_path)     # (each alone, as MLX compiles them)
        assert r.returncode == 0, (mk, mv, haswin, append, r.stderr[-4000:])
    for mk, mv, win in (("turboquant", "turboquant", True), ("kivi", "kivi", True), ("turboquant", "kivi", (False, True))):
        kw, vw = fused._roles(win)
        ah, text = fused.assemble("metal", mk, mv, False, win, False, True)
        types = {n: "int32_t" for n in ("base", "vbase", "wrow")}
        types.update({n: "half" for n in ("kx", "vx", "kwb", "vwb")}, after="bool", kconst="uint32_t",
                     vconst="uint32_t", kcodes1="uint32_t", kcodes2="uint32_t", vcodes1="uint32_t", vcodes2="uint32_t",
                     kf_s1="half", kf_s2="half", vf_s1="half", vf_s2="half", flags="bool")
        consts = [("KM", src.METHOD_IDS[mk]), ("VM", src.METHOD_IDS[mv]), ("D", 128), ("KTS", "half"), ("VTS", "half"),
                  ("KB1", 0), ("KB2", 0), ("KGS", 0), ("VB1", 0), ("VB2", 0), ("VGS", 0)] \
            + ([("KXT", "half")] if kw else []) + ([("VXT", "half")] if vw else [])
        body = _metal_kernel("append_whole", text, fused.inputs(mk, mv, win, False, True), fused.OUTPUTS, types, consts)
        r = tks._gxx_metal(ah + body, tmp_path)
        assert r.returncode == 0, (mk, mv, win, r.stderr[-4000:])
