"""KIVI keys of each row's own phase beside per-token values (R = 0) in a ragged batch (cache/ragged_step.py's
RaggedKiviKeysInPlace: the mirror of the mixed pair's plan) through the library's own DecodeStep, every launch run by
its kernel body on the CPU (tests/test_ragged_step_emulated.py's `bodies`): the plan's first step the append kernel
alone (kernels/append.py MIXED with the keys' window and rphase), every later one the ragged MIXED partial with the
append inside (APPEND + VQ_RAGGED + VQ_RKEYS, HASWIN 2) and its combine. The bodies write into the cache's own buffers,
so what is checked is what the host planned: each row's stored bytes after every step are, byte for byte, its single
cache's (the MLX ops path), and each row's output is within the emulated tests' tolerance of float64 over it."""
from __future__ import annotations

import dataclasses
import shutil

import mlx.core as mx
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import layouts
from veloxquant.accelerated.cache import ragged, ragged_step
from veloxquant.accelerated.kernels import append as fused
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import backend
from veloxquant.accelerated.ops import attention as oatt
from _attention_util import CUDA_UNIT_PRELUDE
from _batch_util import poisoned
import test_attention_kernels_emulated as emu
import test_batch_ragged_mixed_kernels_emulated as rmk
import test_ragged_step_emulated as rse
from test_ragged_step_emulated import bodies   # noqa: F401  (the fixture)


class _KeysAppend(rse._Append):
    """The append kernel's MIXED ragged variant with KIVI keys (vq_append_kivi_{values' method}_m10_g, or _m11_g with
    the values' window too) run by its body."""

    def __init__(self, ns, name, names):
        rest = name.removeprefix("vq_append_kivi_").replace("_apart", "")
        self.mv = rest[:rest.find("_m1")]      # (the values' per-token method)
        assert self.mv in layouts.KERNEL_IDS and self.mv != "kivi" and name.endswith(("_m10_g", "_m11_g")), name
        self.ns, self.names = ns, list(names)
        self.apart, self.ragged, self.win = "_apart" in name, True, (True, name.endswith("_m11_g"))

    def _body(self) -> str:
        return fused.body("kivi", self.mv, self.apart, self.win, True)


# (name, G, keys' R, lengths, the append inside): each case's rows of at least two key phases; g16-R8: the 55-token
# row's phase flushes at the plan's first step (the append kernel's own launch); g32-R128: KIVI's default window;
# append-alone: fuse_append off (every step's append the kernel's own launch, the partial without it)
CASES = [("g16-R8", 16, 8, [37, 50, 64, 21, 55], True), ("g32-R128", 32, 128, [200, 163, 181, 150], True),
         ("g16-R8-append-alone", 16, 8, [37, 50, 64, 21, 55], False)]
# the keys with R = 0 (their window each row's unflushed group; a flush's last key the chunk's own: the OWN text, tag
# 'og'): rows of two or more phases; the 47-token row's phase flushes at the plan's first step (the append alone)
R0_CASES = [("g16-R0", 16, 0, [37, 50, 64, 21, 47], True), ("g32-R0", 32, 0, [200, 163, 181, 150], True)]
# the values with a window too (vwin: RaggedKiviKeysWindowsInPlace, HASWIN 4): one window for both roles (8, and the
# benchmarks' 32), the values' the wider (12: their token encoded past the keys' boundary in some rows; 40: the
# values' count below the keys' least boundary, nenc theirs)
WINDOWED_CASES = [("g16-R8-V8", 16, 8, 8, [37, 50, 64, 21, 55], True),
                  ("g16-R8-V12", 16, 8, 12, [37, 50, 64, 21, 55], True),
                  ("g16-R8-V40", 16, 8, 40, [37, 50, 64, 21, 55], True),
                  ("g32-R32-V32", 32, 32, 32, [200, 163, 181, 150], True),
                  ("g16-R8-V8-append-alone", 16, 8, 8, [37, 50, 64, 21, 55], False)]
# the values' other per-token methods (method, bits): rabitq's codes 1-bit only
VALUE_METHODS = [("turboquant", 3), ("turboquant_rvq", 3), ("turboquant_prod", 3), ("rabitq", 1)]


def _maker(g: int, window: int, value_method: str = "turboquant", value_bits: int = 3, vwin: int = 0, vg: int = 0):
    def make():     # (vg: the values' own group size, mlx_affine's coordinate groups; the keys' G is g)
        c = vc.VeloxKVCache(key_method="kivi", key_bits=2, value_method=value_method, value_bits=value_bits,
                            group_size=vg or g, seed=2, layer=1, window=window)
        c.key_params = dataclasses.replace(c.key_params, group_size=g)
        c.value_params = dataclasses.replace(c.value_params, window=vwin)     # (per-token values: R = 0, or vwin)
        return c
    return make


def _fused_steps(bodies, monkeypatch, tune, g, window, lengths, inside, value_method="turboquant",  # noqa: F811
                 value_bits=3, vwin=0, vg=0):
    """G + 2 steps of rse.fused_steps (each row's bytes and output its single cache's after every step), every row's
    keys flushing; the first step's append the kernel's own launch, every later one inside the ragged MIXED partial
    (HASWIN 2, or 4 with the values' window vwin; the keys' phases) unless `inside` is off."""
    monkeypatch.setattr(rse, "_Append", _KeysAppend)
    tune(fuse_append=inside)
    rse.flushing_steps(bodies, _maker(g, window, value_method, value_bits, vwin, vg), lengths, g + 2, "_k", inside,
                       4 if vwin else 2)
    assert {x["key"][:2] for x in bodies.launches} == {(layouts.KERNEL_IDS["kivi"], layouts.KERNEL_IDS[value_method])}


@pytest.mark.parametrize("g, window, lengths, inside", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_ragged_kivi_keys_batch_steps_through_the_fused_decode_step(bodies, monkeypatch, tune,  # noqa: F811
                                                                      g, window, lengths, inside):
    _fused_steps(bodies, monkeypatch, tune, g, window, lengths, inside)


@pytest.mark.parametrize("g, window, lengths, inside", [c[1:] for c in R0_CASES], ids=[c[0] for c in R0_CASES])
def test_a_ragged_kivi_keys_batch_without_windows_steps_through_the_fused_decode_step(bodies, monkeypatch,  # noqa
                                                                                      tune, g, window, lengths, inside):
    """The keys with R = 0 (values R = 0 too): a flushing row's group ends with the chunk's own key (read from the
    chunk), which the keys' window after the step keeps for the rows that do not flush; the fused partial is the OWN
    text (no window rows as the keys' own)."""
    _fused_steps(bodies, monkeypatch, tune, g, window, lengths, inside)
    assert all(x["key"][8] == katt.src.OWN for x in bodies.launches if x["key"][6]), bodies.launches


@pytest.mark.parametrize("g, window, vwin, lengths, inside", [c[1:] for c in WINDOWED_CASES],
                         ids=[c[0] for c in WINDOWED_CASES])
def test_a_windowed_ragged_kivi_keys_batch_steps_through_the_fused_decode_step(bodies, monkeypatch, tune,  # noqa
                                                                               g, window, vwin, lengths, inside):
    """The values with a window of their own (each step their oldest window token encoded in every row, the chunk
    copied into their window; the partial HASWIN 4 with the append inside)."""
    _fused_steps(bodies, monkeypatch, tune, g, window, lengths, inside, vwin=vwin)


@pytest.mark.parametrize("method, bits", VALUE_METHODS[1:], ids=[m for m, _ in VALUE_METHODS[1:]])
def test_a_ragged_kivi_keys_batch_of_other_values_steps_through_the_fused_decode_step(bodies, monkeypatch,  # noqa
                                                                                      tune, method, bits):
    """Values of another per-token method (MV) beside KIVI keys G = 16, R = 8: each row's bytes and output its single
    cache's after every step."""
    _fused_steps(bodies, monkeypatch, tune, 16, 8, [37, 50, 64, 21, 55], True, method, bits)


# mlx_affine values, their coordinate groups (vg: 32 or 64 of d = 64) beside KIVI keys G = 16, R = 8: (id, vg, values'
# R); the windowed one takes RaggedKiviKeysWindowsInPlace (HASWIN 4)
AFFINE_CASES = [("vg32", 32, 0), ("vg64", 64, 0), ("vg32-V8", 32, 8)]


@pytest.mark.parametrize("vg, vwin", [c[1:] for c in AFFINE_CASES], ids=[c[0] for c in AFFINE_CASES])
def test_a_ragged_kivi_keys_batch_of_affine_values_steps_through_the_fused_decode_step(bodies, monkeypatch,  # noqa
                                                                                       tune, vg, vwin):
    """mlx_affine 4-bit values (coordinate groups vg) beside KIVI keys G = 16, R = 8: each row's bytes and output its
    single cache's after every one of G + 2 steps (a per-token scope's rows encode wherever x reaches the keys' phase,
    append.RAGGED_ENCODES), every partial of the affine value method (MV)."""
    _fused_steps(bodies, monkeypatch, tune, 16, 8, [37, 50, 64, 21, 55], True, "mlx_affine", 4, vwin, vg)


# (name, G, keys' R, values' R, lengths, values (method, bits, their group size)): the appended-inside cases, and
# mlx_affine values (coordinate groups of 32 beside the keys' G = 16) at values' R 0 and 8, for a CUDA GPU
AFFINE_VALUES = ("mlx_affine", 4, 32)
GPU_CASES = ([(c[0], c[1], c[2], 0, c[3], ("turboquant", 3, 0)) for c in CASES + R0_CASES if c[4]]
             + [(*c[:5], ("turboquant", 3, 0)) for c in WINDOWED_CASES if c[5]]
             + [("affine-vg32-R8", 16, 8, 0, [37, 50, 64, 21, 55], AFFINE_VALUES),
                ("affine-vg32-R8-V8", 16, 8, 8, [37, 50, 64, 21, 55], AFFINE_VALUES)])


@pytest.mark.parametrize("g, window, vwin, lengths, values", [c[1:] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES])
def test_a_ragged_kivi_keys_batch_steps_through_the_fused_decode_step_on_the_gpu(g, window, vwin, lengths, values,
                                                                                 tune, monkeypatch):
    """The same steps on a CUDA GPU (MLX's CUDA build, the kernels compiled and launched by MLX): each row's bytes and
    output its single cache's after every step, the fused steps' partial the ragged MIXED kernel with KIVI keys and
    the append inside (HASWIN 2, its OWN text with the keys' R = 0, or 4 with the values' window) (skipped without a
    CUDA backend)."""
    if not backend.available()[0] or backend.backend() != "cuda":
        pytest.skip("no CUDA GPU backend here")
    tune(ragged=True, fuse_append=True)
    method, bits, vg = values
    fused_ = rse.fused_partials(monkeypatch, _maker(g, window, method, bits, vwin, vg), lengths, g, "_k")
    want = (4, True) if vwin else (2, True if window else katt.src.OWN)
    assert fused_ and all((a["mk"], a["haswin"], a["ragged"]) == (layouts.KERNEL_IDS["kivi"], *want) for a in fused_), fused_


@pytest.mark.parametrize("values", [("turboquant", 3, 0, 0), ("mlx_affine", 4, 0, 32)], ids=["turboquant", "affine-vg32"])
def test_a_rejected_kivi_keys_step_rolls_every_row_back(bodies, monkeypatch, values):  # noqa: F811
    """A NaN in one row's keys, stored by a fused step (copied into the keys' window): the deferred check raises at a
    later step with every row back before that chunk (marks over the in-place buffers), and the steps after it (a new
    plan) keep each row its single cache's bytes."""
    monkeypatch.setattr(rse, "_Append", _KeysAppend)
    rse.rollback_case(bodies, _maker(16, 8, *values), [37, 50, 64, 21, 55], vc.VeloxKVCache.merge,
                      ragged_step.RaggedKiviKeysInPlace)


# (name, keys' bits, G, keys' R, values' R, d, lengths): the keys' window wider than a group, KIVI's default R = 128,
# R = 0 (the keys' window up to G - 1 tokens), and the values' window too (HASWIN 4: wider than the keys')
PARTIAL_CASES = [("kivi2-tq3-g16-R8-d64", 2, 16, 8, 0, 64, [37, 50, 64, 21]),
                 ("kivi4-tq3-g32-R128-d128", 4, 32, 128, 0, 128, [200, 163, 181, 150]),
                 ("kivi2-tq3-g16-R0-d64", 2, 16, 0, 0, 64, [37, 50, 64, 21]),
                 ("kivi2-tq3-g16-R8-V12-d64", 2, 16, 8, 12, 64, [37, 50, 64, 21])]


@pytest.mark.parametrize("c", [c[1:] for c in PARTIAL_CASES], ids=[c[0] for c in PARTIAL_CASES])
def test_the_ragged_kivi_keys_partial_attends_each_row_as_its_own_cache(c, monkeypatch, tune):
    """The ragged MIXED partial without the append (VQ_RKEYS, HASWIN 2, or 4 with the values' window) over the
    ragged cache's own records after general-path steps, every byte a row must not read poisoned, blocks in reverse
    order: each row within the attention budget of float64 over its single cache, over G + 1 steps that move the rows'
    key boundaries apart."""
    kb, g, kw, vw, d, lengths = c

    def caches():
        out = []
        for i, t in enumerate(lengths):
            x = _maker(g, kw, vwin=vw)()
            x.key_params = dataclasses.replace(x.key_params, bits=kb)
            x.update_and_fetch(*rmk._kv(t, 7 + i, d))
            out.append(x)
        return out
    tune(ragged=True, tokens_per_split=24)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    katt._static.cache_clear()
    batch, singles = vc.VeloxKVCache.merge(caches()), caches()
    haswin = katt.mixed_windows(batch.inner._k.params, batch.inner._v.params)
    assert ragged.is_ragged(batch.inner) and haswin == (4 if vw else 2), haswin
    seen = set()
    for step, q, kk, vv, mask in rmk.checked_steps(batch, singles, g, d):
        kr, vr = kk.record, vv.record
        assert isinstance(kr, oatt.RaggedRecord) and isinstance(vr, oatt.RaggedRecord), (kr, vr)
        seen.add(tuple(batch.inner._k.bounds()))
        with pytest.MonkeyPatch.context() as m:
            m.setattr(backend, "available", lambda: (True, "emulated"))
            assert katt.supports(q, kr, vr, mask, True), "the kernels refuse the ragged KIVI keys step"
            plan = katt.launch_plan(q, kr, vr, d ** -0.5, mask, mixed=True)
        assert plan.key[2] == haswin and plan.key[7] and plan.key[8] and not plan.key[4], plan.key
        assert dict(plan.partial_template)["RW"] == kw and plan.partial_inputs[-1] is kr.phases, plan.partial_template
        got = emu.emulate(q, poisoned(kr, batch.inner._k), poisoned(vr, batch.inner._v), d ** -0.5, mask,
                          reverse=True, mixed=True)
        for i, s in enumerate(singles):
            rmk._within_budget(got[i:i + 1], q[i:i + 1], s, d, f"step {step}: row {i} (keys' bounds "
                                                                f"{batch.inner._k.bounds()})")
    katt._static.cache_clear()
    assert len({b for bs in seen for b in bs}) > len(lengths), "the steps never moved the rows' boundaries apart"


@pytest.mark.parametrize("backend_", ["cuda", "metal"])
def test_the_ragged_kivi_keys_texts_refuse_the_values_window_only(backend_):
    """No plan launches a ragged KIVI keys text of HASWIN 3 (the values' window only): KIVI keys keep a window at any
    R (mixed_windows gives their pairs 2 or 4), so assemble refuses it, with the append inside or without, and takes
    HASWIN 2 and 4 (and HASWIN 3 where the values are KIVI's)."""
    from veloxquant import spec
    kivi = katt.src.METHOD_IDS["kivi"]
    for value_method, _ in [("mlx_affine", 4)] + VALUE_METHODS:
        for kw, vw in ((0, 0), (8, 0), (0, 8), (8, 8)):
            kp = spec.Params("kivi", bits=2, group_size=16, window=kw, role="k").resolved()
            vp = spec.Params(value_method, bits=4 if value_method == "mlx_affine" else 1 if value_method == "rabitq"
                             else 3, window=vw, role="v").resolved()
            assert katt.mixed_windows(kp, vp) in (2, 4), (value_method, kw, vw)
        mv = katt.src.METHOD_IDS[value_method]
        for append, ragged_ in ((False, True), (True, True), (True, katt.src.OWN)):
            with pytest.raises(ValueError, match="KIVI keys"):
                katt.src.assemble("partial", backend_, kivi, mv, 3, False, False, append, True, ragged_)
            for haswin in (2, 4):
                if ragged_ is True or haswin == 2:
                    assert katt.src.assemble("partial", backend_, kivi, mv, haswin, False, False, append, True,
                                             ragged_)[1], (value_method, haswin, append)
            assert katt.src.assemble("partial", backend_, mv, kivi, 3, False, False, append, True, ragged_)[1]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_ragged_kivi_keys_append_compiles(tmp_path):
    """The append kernel alone for the plan (kernels/append.py MIXED with the keys' window and rphase: KIVI 2-bit keys,
    turboquant 3-bit values) as mx.fast.cuda_kernel wraps it, both role layouts: sm_90, no spills."""
    from veloxquant import spec
    kp = spec.Params("kivi", bits=2, group_size=32, window=128, role="k").resolved()
    vp = spec.Params("turboquant", bits=3, window=0, role="v").resolved()
    rse.append_compiles(tmp_path, "append_kivi_keys_ragged", kp, vp, (True, False))


def _partial_text(kp, vp, d: int, backend_: str, ragged_: bool, append: bool) -> tuple:
    """(header + the kernel as MLX would wrap it, the source alone) of the MIXED partial for kp / vp with row starts as
    attention.py launches it (template from _static: 4 rows, 8 KV heads, GQA 4, float16), ragged or not."""
    from veloxquant.accelerated import tuning
    from test_attention_kernels_source import _kernel, _metal_kernel
    haswin, f16 = katt.mixed_windows(kp, vp), mx.float16
    katt._static.cache_clear()
    try:
        st = katt._static(kp, vp, 4, 32, 1, d, 8, 16, haswin, False, f16, d ** -0.5, False, 16,
                          tuning.DEFAULT.replace(ragged=True), (f16,) * 4 if append else None, True, ragged_)
    finally:
        katt._static.cache_clear()
    assert st.key[2] == haswin and not st.key[4] and bool(st.key[8:]) == ragged_, st.key
    header, source = katt.src.assemble("partial", backend_, st.key[0], st.key[1], haswin, False, False, append, True,
                                       st.key[8] if ragged_ else False)
    h = "__half" if backend_ == "cuda" else "half"
    types = {n: h for n in ("q", "ks0", "ks1", "kgs", "kgz", "kw", "vs0", "vs1", "vgs", "vgz", "vw", "kx", "vx", "kf",
                            "vf")}
    types.update({n: "uint32_t" for n in ("kc1", "kc2", "vc1", "vc2", "kconst", "vconst")})
    types.update(flags="bool" if append else "uint32_t", nenc="int32_t", rstart="int32_t", rphase="int32_t",
                 token="bool")
    outs = katt.src.APPEND_OUTPUTS if append else katt.src.PARTIAL_OUTPUTS
    if backend_ == "cuda":
        tmpl = [(n, h if v == f16 else v) for n, v in st.template]
        return (CUDA_UNIT_PRELUDE + header + "namespace mlx::core::cu {\n"
                + _kernel("partial_kivi_keys", source, st.names, outs, types, tmpl) + "}\n"), source
    tmpl = [(n, h if v == f16 else "float" if v == mx.float32 else v) for n, v in st.template]
    return header + _metal_kernel("partial_kivi_keys", source, st.names, outs, types, tmpl), source


def _params(kwin: int, vwin: int = 0, affine: bool = False):
    from veloxquant import spec
    vp = (spec.Params("mlx_affine", bits=4, group_size=64, window=vwin, role="v") if affine
          else spec.Params("turboquant", bits=3, window=vwin, role="v"))
    return spec.Params("kivi", bits=2, group_size=32, window=kwin, role="k").resolved(), vp.resolved()


# (keys' window, values' window, the append inside, mlx_affine 4-bit values of 64-coordinate groups instead of
# turboquant's): HASWIN 2 without and with the append, at the keys' R = 0 (the OWN text), and HASWIN 4 (one window 32
# for the layer) with the append; the affine values with the append, HASWIN 2
COMPILE_CASES = [(128, 0, False, False), (128, 0, True, False), (0, 0, True, False), (32, 32, True, False),
                 (128, 0, True, True)]
COMPILE_IDS = [f"k{a}-v{b}{'-append' if c else ''}{'-affine' if d else ''}" for a, b, c, d in COMPILE_CASES]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
@pytest.mark.parametrize("kwin, vwin, append, affine", COMPILE_CASES, ids=COMPILE_IDS)
def test_cuda_ragged_kivi_keys_partial_compiles_without_spills(kwin, vwin, append, affine, monkeypatch, tmp_path):
    """The ragged MIXED partial with KIVI keys (2-bit, G = 32) beside turboquant 3-bit values, d = 128: sm_80 and
    sm_90, no spills and no stack frame beyond the row-starts MIXED partial's at the same template (mlx_affine values:
    the same checks)."""
    from _attention_util import resources
    kp, vp = _params(kwin, vwin, affine)
    monkeypatch.setattr(katt, "_sm_count", lambda: 132)
    plain, rag = (resources(_partial_text(kp, vp, 128, "cuda", r, append)[0], tmp_path / f"kivi_keys_{int(r)}")
                  for r in (False, True))
    print("kivi keys", kwin, vwin, append, affine, "registers, stack frame, spill stores, spill loads: starts", plain,
          "ragged", rag)
    for arch, (regs, stack, stores, loads) in rag.items():
        assert stores == loads == 0 and regs <= 255 and stack <= plain[arch][1], (arch, rag, plain)


@pytest.mark.parametrize("kwin, vwin, append, affine", COMPILE_CASES, ids=COMPILE_IDS)
def test_metal_ragged_kivi_keys_partial_compiles_against_shim(kwin, vwin, append, affine, tmp_path):
    """The same partials as Metal would get them (tests/metal_shim.h: a syntax check of the Metal names; no Apple GPU
    has run them), and the Metal lint finds nothing in them beyond the row-starts MIXED text's own finding."""
    import test_kernels_source as tks
    kp, vp = _params(kwin, vwin, affine)
    text, source = _partial_text(kp, vp, 128, "metal", True, append)
    r = tks._gxx_metal(text, tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    plain = _partial_text(kp, vp, 128, "metal", False, append)[1]
    pointer = "pointer or reference declaration (Metal pointers need an address space)"
    assert pointer in tks.metal_rule_violations(plain)
    assert not [b for b in tks.metal_rule_violations(source) if b != pointer], tks.metal_rule_violations(source)
