"""The MIXED partial under the ragged specialization (VQ_RAGGED with a MIXED window: turboquant keys per token beside
KIVI values of each row's own group phase, accelerated/cache/ragged.py; docs/ragged-kivi.md) through the kernel bodies
run on the CPU (tests/test_attention_kernels_emulated.py's emulation, blocks in reverse order), without the append.

The records are the ragged B-row cache's own (merge of single caches whose lengths differ mod G, then decode steps
crossing every row's flush); every byte a row must not read is poisoned (all bits set: NaN scales, zeros and window
tokens): its padding, its rows past its own boundary in the fields, its window slots below its own window. Per row,
the output is within the attention budget (conformance's, plus the float16 queries' rounding) of float64 over its
single cache's record. Cases: values' windows 0 (KIVI's up to G - 1 tokens), 32 and 128, keys without a window and
with one (HASWIN 4, also wider than the values'), d = 64 / 128, KIVI values 2 / 4 bits, turboquant keys 3 / 4 bits.
"""
from __future__ import annotations

import dataclasses
import shutil

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated.cache import masks, ragged
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import backend
from veloxquant.accelerated.ops import attention as oatt
from veloxquant.conformance.attention_checks import attention_budget, attention_f64
from _attention_util import CUDA_UNIT_PRELUDE, resources
from _batch_util import poisoned
import test_attention_kernels_emulated as emu   # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

H, REP = 2, 2

CASES = [
    # id, key bits, value bits, G, keys' window, values' window, d, lengths
    ("tq3-kivi2-g32-R128-d128", 3, 2, 32, 0, 128, 128, [200, 163, 181, 150]),    # the recommended configuration
    ("tq4-kivi2-g32-R0-d64", 4, 2, 32, 0, 0, 64, [37, 50, 64, 21]),
    ("tq3-kivi4-g16-R32-d64", 3, 4, 16, 0, 32, 64, [77, 50, 64, 21]),           # (21 < R: a row all window)
    ("tq4-kivi4-g16-k32-R32-d128", 4, 4, 16, 32, 32, 128, [77, 50, 64, 21]),    # keys' window too: HASWIN 4
    ("tq3-kivi2-g16-k16-R8-d64", 3, 2, 16, 16, 8, 64, [37, 50, 64, 21]),        # keys' window the wider
]


def _kv(t, seed, d, b=1):
    k = mx.random.normal((b, H, t, d), key=mx.random.key(seed)).astype(mx.float16)
    v = mx.random.normal((b, H, t, d), key=mx.random.key(seed + 1000)).astype(mx.float16)
    return k, v


def _caches(kb, vb, g, kw, vw, d, lengths):
    out = []
    for i, t in enumerate(lengths):
        c = vc.VeloxKVCache(key_method="turboquant", key_bits=kb, value_method="kivi", value_bits=vb, group_size=g,
                            seed=2, layer=1, window=vw)
        c.key_params = dataclasses.replace(c.key_params, window=kw)    # (one `window` sets both roles')
        c.update_and_fetch(*_kv(t, 7 + i, d))
        out.append(c)
    return out


@pytest.fixture
def ragged_tuning(monkeypatch, tune):
    """tuning's ragged on, splits of 24 tokens, 4 multiprocessors; the launch plans made here cleared after."""
    tune(ragged=True, tokens_per_split=24)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    katt._static.cache_clear()
    yield
    katt._static.cache_clear()


def checked_steps(batch, singles, g: int, d: int, qdt=mx.float16, each=None):
    """G + 1 decode steps of the ragged `batch`, its single caches stepped alike (each(batch) after every step, where
    given); yields (step, queries of dtype qdt, keys, values, row starts mask) at every third step and the last."""
    for step in range(g + 1):
        k, v = _kv(1, 900 + step, d, b=len(singles))
        mask = masks.row_starts(batch.make_mask(1))
        kk, vv = batch.update_and_fetch(k, v)
        for i, s in enumerate(singles):
            s.update_and_fetch(k[i:i + 1], v[i:i + 1])
        if each is not None:
            each(batch)
        if step % 3 and step != g:
            continue
        q = mx.random.normal((len(singles), REP * H, 1, d), key=mx.random.key(40 + step)).astype(qdt)
        yield step, q, kk, vv, mask


def _within_budget(got, q, single, d, when):
    qf = np.array(q.astype(mx.float32)).astype(np.float64)
    k64, v64 = (np.array(s.dequantized()).astype(np.float64) for s in (single._k, single._v))
    want, p, kr, vr = attention_f64(qf, k64, v64, d ** -0.5)
    budget = attention_budget(qf, kr, vr, p, d ** -0.5, True, False) + np.abs(want) * 2.0 ** -11
    ratio = np.abs(got.astype(np.float64) - want) / budget
    assert ratio.max() <= 1.0, f"{when}: worst error / budget {ratio.max():.3g} vs float64 over its own cache"


@pytest.mark.parametrize("c", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_ragged_mixed_partial_attends_each_row_as_its_own_cache(c, ragged_tuning):
    kb, vb, g, kw, vw, d, lengths = c
    batch = vc.VeloxKVCache.merge(_caches(kb, vb, g, kw, vw, d, lengths))
    singles = _caches(kb, vb, g, kw, vw, d, lengths)
    assert ragged.is_ragged(batch.inner), "not one ragged B-row cache"
    haswin = katt.mixed_windows(batch.inner._k.params, batch.inner._v.params)
    assert haswin == (4 if kw else 3), haswin
    seen = set()
    for step, q, kk, vv, mask in checked_steps(batch, singles, g, d):
        kr, vr = kk.record, vv.record
        assert isinstance(kr, oatt.RaggedRecord) and isinstance(vr, oatt.RaggedRecord), (kr, vr)
        seen.add(tuple(batch.inner._v.bounds()))
        with pytest.MonkeyPatch.context() as m:
            m.setattr(backend, "available", lambda: (True, "emulated"))
            assert katt.supports(q, kr, vr, mask, True), "the kernels refuse the ragged mixed step"
            assert not katt.supports(q, kr, vr, mask), "the ragged KIVI partial took a mixed pair"
            plan = katt.launch_plan(q, kr, vr, d ** -0.5, mask, mixed=True)
        assert plan.key[2] == haswin and plan.key[7] and plan.key[8] and not plan.key[4], plan.key
        assert "rphase" in plan.partial_names and dict(plan.partial_template)["RW"] == vw, plan.partial_template
        got = emu.emulate(q, poisoned(kr, batch.inner._k), poisoned(vr, batch.inner._v), d ** -0.5, mask,
                          reverse=True, mixed=True)
        for i, s in enumerate(singles):
            _within_budget(got[i:i + 1], q[i:i + 1], s, d, f"step {step}: row {i} (values' bounds "
                                                            f"{batch.inner._v.bounds()})")
    assert len({b for bs in seen for b in bs}) > len(lengths), "the steps never moved the rows' boundaries apart"


def test_the_ragged_mixed_pair_is_refused_where_the_loop_does_not_hold_it(ragged_tuning):
    """No MIXED flag, or no KIVI role (per-token methods in both): the ragged partials refuse (the ops path attends);
    KIVI keys beside turboquant or mlx_affine values are taken (VQ_RKEYS: tests/test_ragged_kivi_keys_step_emulated.py;
    mlx_affine's since the encode gate tests group phases in KIVI scopes only)."""
    batch = vc.VeloxKVCache.merge(_caches(3, 2, 16, 0, 8, 64, [37, 50]))
    k, v = _kv(1, 5, 64, b=2)
    mask = masks.row_starts(batch.make_mask(1))
    kk, vv = batch.update_and_fetch(k, v)
    q = mx.random.normal((2, REP * H, 1, 64), key=mx.random.key(3)).astype(mx.float16)
    swapped = [dataclasses.replace(r, params=dataclasses.replace(p, role=r.params.role)) for r, p in
               ((kk.record, vv.record.params), (vv.record, kk.record.params))]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(backend, "available", lambda: (True, "emulated"))
        assert katt.supports(q, kk.record, vv.record, mask, True)
        assert not katt.supports(q, kk.record, vv.record, mask)
        assert katt.supports(q, *swapped, mask, True), "KIVI keys beside turboquant values refused"
        affine = dataclasses.replace(swapped[1], params=dataclasses.replace(swapped[1].params, method="mlx_affine"))
        assert katt.supports(q, swapped[0], affine, mask, True), "KIVI keys beside mlx_affine values refused"
        per_token = dataclasses.replace(vv.record, params=dataclasses.replace(vv.record.params, method="turboquant"))
        assert not katt.supports(q, kk.record, per_token, mask, True), "a ragged pair without a KIVI role taken"


def _compiled_resources(kp, vp, d, ragged: bool, stem, append: bool = False) -> dict:
    """{arch: (registers, stack frame, spill stores, spill loads)} of the MIXED partial for kp / vp with row starts as
    attention.py launches it (template from _static: 4 rows, 8 KV heads, GQA 4, float16), `ragged` or not, with the
    decode step's append inside or not."""
    from veloxquant.accelerated import tuning
    from test_attention_kernels_source import _kernel
    haswin = katt.mixed_windows(kp, vp)
    f16 = mx.float16
    st = katt._static(kp, vp, 4, 32, 1, d, 8, 16, haswin, False, f16, d ** -0.5, False, 16,
                      tuning.DEFAULT.replace(ragged=True), (f16,) * 4 if append else None, True, ragged)
    assert st.key[2] == haswin and not st.key[4] and bool(st.key[8:]) == ragged, st.key
    # (the ragged text _static picks: the values with R = 0 and the append, attention_source.OWN's)
    header, source = katt.src.assemble("partial", "cuda", st.key[0], 4, haswin, False, False, append, True,
                                       st.key[8] if ragged else False)
    h = "__half"
    types = dict(q=h, kc1="uint32_t", kc2="uint32_t", ks0=h, ks1=h, kgs=h, kgz=h, kw=h, vc1="uint32_t", vgs=h,
                 vgz=h, vw=h, kx=h, vx=h, vf=h,
                 kconst="uint32_t", vconst="uint32_t", flags="bool" if append else "uint32_t", nenc="int32_t",
                 rstart="int32_t", rphase="int32_t", token="bool")
    outs = katt.src.APPEND_OUTPUTS if append else katt.src.PARTIAL_OUTPUTS
    tmpl = [(n, h if v == mx.float16 else v) for n, v in st.template]
    text = (CUDA_UNIT_PRELUDE + header + "namespace mlx::core::cu {\n"
            + _kernel("partial_mixed", source, st.names, outs, types, tmpl) + "}\n")
    return resources(text, stem)


# (key bits, value bits, G, keys' window, values' window, d, the append inside): HASWIN 3 (the recommended pair, also
# with the append: cache/ragged_step.py's mixed plan) and 4 (also with the append: its windowed plan)
COMPILE_CASES = [(3, 2, 32, 0, 128, 128, False), (3, 2, 32, 0, 128, 128, True), (4, 4, 16, 32, 32, 64, False),
                 (3, 2, 32, 32, 32, 128, True),     # (one window 32 for both roles, the windowed plan's)
                 (3, 2, 32, 0, 0, 128, True)]       # (window 0: the values' OWN text)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
@pytest.mark.parametrize("case", COMPILE_CASES, ids=[f"tq{c[0]}-kivi{c[1]}-g{c[2]}-k{c[3]}-R{c[4]}-d{c[5]}"
                                                     f"{'-append' if c[6] else ''}" for c in COMPILE_CASES])
def test_cuda_ragged_mixed_partial_compiles_without_spills(case, monkeypatch, tmp_path):
    """The ragged MIXED partial (without and with the append inside): sm_80 and sm_90, no spills and no stack frame
    beyond the one the MIXED scalar loop with row starts (a left-padded batch's) already has, at the same template."""
    from veloxquant import spec
    kb, vb, g, kw, vw, d, append = case
    kp = spec.Params("turboquant", bits=kb, window=kw, role="k").resolved()
    vp = spec.Params("kivi", bits=vb, group_size=g, window=vw, role="v").resolved()
    monkeypatch.setattr(katt, "_sm_count", lambda: 132)
    katt._static.cache_clear()
    try:
        plain, rag = (_compiled_resources(kp, vp, d, r, tmp_path / f"mixed_{int(r)}", append) for r in (False, True))
    finally:
        katt._static.cache_clear()
    print(case, "registers, stack frame, spill stores, spill loads: starts", plain, "ragged", rag)
    for arch, (regs, stack, stores, loads) in rag.items():
        assert stores == loads == 0 and regs <= 255 and stack <= plain[arch][1], (arch, rag, plain)


# (keys' method, bits, their coordinate groups where they have them): rabitq 1-bit, mlx_affine 4-bit with G_k 64
# beside the values' G 32
OTHER_KEYS = [("rabitq", 1, None), ("mlx_affine", 4, 64)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
@pytest.mark.parametrize("kw", [0, 32], ids=["haswin3", "haswin4"])
@pytest.mark.parametrize("method, bits, kg", OTHER_KEYS, ids=[f"{m}_keys" for m, _, _ in OTHER_KEYS])
def test_cuda_ragged_mixed_partial_of_other_keys_compiles_without_spills(method, bits, kg, kw, monkeypatch, tmp_path):
    """The ragged MIXED partial with the append inside for other per-token keys (R = 0 or 32) beside KIVI 2-bit values
    (G = 32, R = 128 / 32), d = 128: cache/ragged_step.py's mixed plans take any per-token key method; sm_80 and
    sm_90, no spills and no stack frame beyond the MIXED scalar loop's with row starts at the same template."""
    from veloxquant import spec
    kp = spec.Params(method, bits=bits, group_size=kg, window=kw, role="k").resolved()
    vp = spec.Params("kivi", bits=2, group_size=32, window=kw or 128, role="v").resolved()
    monkeypatch.setattr(katt, "_sm_count", lambda: 132)
    katt._static.cache_clear()
    try:
        plain, rag = (_compiled_resources(kp, vp, 128, r, tmp_path / f"{method}_{int(r)}", True) for r in (False, True))
    finally:
        katt._static.cache_clear()
    print(method, "keys R", kw, "registers, stack frame, spill stores, spill loads: starts", plain, "ragged", rag)
    for arch, (regs, stack, stores, loads) in rag.items():
        assert stores == loads == 0 and regs <= 255 and stack <= plain[arch][1], (arch, rag, plain)


# (HASWIN, the append inside, the values' window): the recommended pair's texts and keys with a window (each with and
# without the append), and window 0 with the append (the values' OWN text)
METAL_CASES = [(3, False, 128), (3, True, 128), (4, False, 128), (4, True, 128), (3, True, 0)]


@pytest.mark.parametrize("case", METAL_CASES, ids=[f"haswin{c[0]}{'-append' if c[1] else ''}{'-R0' if not c[2] else ''}"
                                                   for c in METAL_CASES])
def test_metal_ragged_mixed_partial_compiles_against_shim(case, tmp_path):
    """The ragged MIXED partial as Metal would get it (tests/metal_shim.h: a syntax check of the Metal names, nothing
    more; no Apple GPU has run it), its template from _static (turboquant 3-bit keys, KIVI 2-bit values, d = 128)."""
    import test_kernels_source as tks
    from veloxquant import spec
    from veloxquant.accelerated import tuning
    from test_attention_kernels_source import _metal_kernel
    haswin, append, vwin = case
    kp = spec.Params("turboquant", bits=3, window=0 if haswin == 3 else 32, role="k").resolved()
    vp = spec.Params("kivi", bits=2, group_size=32, window=vwin, role="v").resolved()
    assert katt.mixed_windows(kp, vp) == haswin
    f16 = mx.float16
    katt._static.cache_clear()
    try:
        st = katt._static(kp, vp, 4, 32, 1, 128, 8, 16, haswin, False, f16, 128 ** -0.5, False, 16,
                          tuning.DEFAULT.replace(ragged=True), (f16,) * 4 if append else None, True, True)
    finally:
        katt._static.cache_clear()
    header, source = katt.src.assemble("partial", "metal", 0, 4, haswin, False, False, append, True, st.key[8])
    types = dict(q="half", kc1="uint32_t", ks0="half", kw="half", vc1="uint32_t", vgs="half", vgz="half", vw="half",
                 kx="half", vx="half", kf="half", vf="half", kconst="uint32_t", vconst="uint32_t",
                 flags="bool" if append else "uint32_t", nenc="int32_t", rstart="int32_t", rphase="int32_t",
                 token="bool")
    tmpl = [(n, "half" if v == f16 else "float" if v == mx.float32 else v) for n, v in st.template]
    outs = katt.src.APPEND_OUTPUTS if append else katt.src.PARTIAL_OUTPUTS
    text = header + _metal_kernel("partial_mixed_ragged", source, st.names, outs, types, tmpl)   # (the append: with
    # the encode header in `header`)
    r = tks._gxx_metal(text, tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    # the Metal rules the shim cannot see (a lint of the raw text: every MIXED text holds the ragged fragment's lines,
    # spliced in, so the row-starts MIXED text is no reference); the pointer-declaration finding is every MIXED
    # partial's already, ragged or not
    plain = katt.src.assemble("partial", "metal", 0, 4, haswin, False, False, append, True, False)[1]
    pointer = "pointer or reference declaration (Metal pointers need an address space)"
    assert pointer in tks.metal_rule_violations(plain)
    assert not [b for b in tks.metal_rule_violations(source) if b != pointer], tks.metal_rule_violations(source)
