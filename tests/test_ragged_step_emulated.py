"""A ragged KIVI batch's decode steps (tuning's ragged: accelerated/cache/ragged.py, its in-place step
cache/ragged_step.py) through the library's own DecodeStep, with every launch run by the kernel BODIES on the CPU:
the partial with the step's append inside (VQ_RAGGED + APPEND: each row flushes its group at its own step) and the
combine as tests/test_rotating_step_emulated.py runs them, and the append launched alone (the plan's first step:
kernels/append.py with `rphase`) by the emulator of tests/test_append_kernel_emulated.py. The bodies write into the
cache's own buffers (numpy views of them), so what is checked is what the host planned: buffers, views, x, the
flush, nenc.

Each row's stored bytes (RaggedStream.row: its fields to its own boundary and its own window) after every step are
its single cache's (the MLX ops path, no kernels), and each row's output is within the emulated tests' tolerance of
float64 over that single cache; every step after the first is one DecodeStep launch pair (partial + combine).
`..._on_the_gpu`: the same steps with MLX's CUDA kernels (skipped without a CUDA backend)."""
from __future__ import annotations

import ctypes
import inspect
import shutil
import types

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import attention as vattention
from veloxquant.accelerated import kernels, layouts, ops
from veloxquant.accelerated.cache import masks, ragged, ragged_step
from veloxquant.accelerated.kernels import append as fused
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import backend
from veloxquant.accelerated.kernels import methods as km
from _attention_util import CUDA_UNIT_PRELUDE, f64_attention
from _batch_util import D, H, filled_with, kv
import _kernel_emulator as ke   # noqa: E402  (tests/ is on sys.path under pytest)
import test_batch_ragged_kivi as rk
from test_attention_kernels_emulated import CTYPES
from test_rotating_step import install_backend, release_backend
from test_rotating_step_emulated import _Combine, _Partial, _shared
from test_window_step import _Commit

G = 16
REP = 2


class _RaggedPartial(_Partial):
    def __init__(self, ns, name, names):
        super().__init__(ns, name, names)
        # (kernels.attention._compiled's tag: 'g' ragged, 'og' the mixed pair's values with R = 0: attention_source.OWN)
        self.key = self.key + (katt.src.OWN if name.endswith("og") else name.endswith("g"),)


class _Append:
    """kernels/append.py's launch (any variant) run by its body in the emulator: the text fused.body makes for the
    kernel's name, the launch's template as constants, its inputs as numpy views of the MLX arrays (written in place)."""

    def __init__(self, ns, name, names):
        self.ns, self.names = ns, list(names)
        rest = name.removeprefix("vq_append_kivi_kivi")
        self.apart, self.ragged, self.whole = "_apart" in rest, rest.endswith("_g"), rest.endswith("_b")
        assert "_w" in rest, name

    def specialized(self, template=None):
        return self

    def _body(self) -> str:
        """The kernel body fused.body makes for this launch's variant (here the KIVI pair's)."""
        return fused.body("kivi", "kivi", self.apart, True, self.ragged, self.whole)

    def _lib(self, inputs, template):
        params, args = [], []
        for j, (n, a) in enumerate(zip(self.names, inputs)):
            params.append(f"const {CTYPES[a.dtype]}* {n}")
            args.append(f"(const {CTYPES[a.dtype]}*)p[{j}]")
            if a.ndim == 4:
                params += [f"Shape {n}_shape", f"Strides {n}_strides"]
                args += [f"shape_of(sh + {4 * j})", f"strides_of(st + {4 * j})"]
        consts = "".join(f"  using {k} = {CTYPES[v]};\n" if isinstance(v, mx.Dtype) else f"  constexpr int {k} = {v};\n"
                         for k, v in template)
        head = (ke.HARNESS.replace("@ENCODE@", "").replace("@DECODE@", "").replace("@ENC_DISPATCH@", "")
                .replace("@DEC_DISPATCH@", ""))
        text = (head + "#define VQ_DEV\n#define VQ_TG\n#define VQ_REF const auto&\n"
                "#define VQ_MUT(type, p) const_cast<type*>(p)\n"
                f"static void app_thread({', '.join(params)}, bool* flags) {{\n{consts}" + ke.PRELUDE
                + self._body() + "}\n"
                + "extern \"C\" int vq_append(int pair, int groups, int warps, void** p, const int64_t* sh, "
                "const int64_t* st) {\n  run_grid(groups, warps, [&] { app_thread("
                + ", ".join(args) + f", (bool*)p[{len(self.names)}]); }});\n  return 0;\n}}\n")
        return ke.compile_library(text, "veloxquant-ragged-append")

    def __call__(self, *, inputs, template, grid, threadgroup, output_shapes, output_dtypes, **kw):
        lib = self._lib(inputs, template)
        ins = [_shared(a) for a in inputs]
        flags = np.ones(output_shapes[0], np.bool_)
        ptrs = (ctypes.c_void_p * (len(ins) + 1))(*[a.ctypes.data for a in ins + [flags]])
        sh, st = np.zeros((len(ins), 4), np.int64), np.zeros((len(ins), 4), np.int64)
        for j, a in enumerate(ins):
            if a.ndim == 4:
                sh[j], st[j] = a.shape, [s // a.itemsize for s in a.strides]
        assert lib.vq_append(0, grid[0] // threadgroup[0], threadgroup[0] // 32, ptrs, ke._ptr(sh), ke._ptr(st)) == 0
        self.ns.appends += 1
        return [mx.array(flags)]


class MixedAppend(_Append):
    """The append kernel's MIXED variant, per-token keys beside KIVI values (vq_append_{keys' method}_kivi_m01, or
    _m11 with the keys' window too; with rphase, ragged: a name ending _g) run by its body."""
    ragged = True

    def __init__(self, ns, name, names):
        rest = name.removeprefix("vq_append_")
        self.mk = rest[:rest.find("_kivi")]      # (the keys' method: turboquant or another per-token one)
        self.whole = name.endswith("_b")        # (tuning's whole_windows)
        assert self.mk in layouts.KERNEL_IDS and self.mk != "kivi" and name.endswith("_g") == self.ragged, name
        assert "_m01" in name or "_m11" in name, name
        self.ns, self.names = ns, list(names)
        self.apart, self.win = "_apart" in name, ("_m11" in name, True)

    def _body(self) -> str:
        return fused.body(self.mk, "kivi", self.apart, self.win, self.ragged, self.whole)


@pytest.fixture
def bodies(monkeypatch, tune):
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed: no CPU emulation")
    ns = types.SimpleNamespace(params=None, launches=[], lib=None, append=False, edit=None, appends=0)
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("cuda", "CPU emulation of the bodies"))
    monkeypatch.setattr(backend, "available", lambda: (True, "CPU emulation of the bodies"))
    monkeypatch.setattr(kernels, "available", lambda: (True, "CPU emulation of the bodies"))
    monkeypatch.setattr(katt, "_mma_available", lambda: False)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    tune(fuse_append=True, fuse_combine=False, tokens_per_split=24, combine_threads=D, ragged=True)

    def cuda_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True):
        if name.startswith("vq_commit"):
            return _Commit(list(input_names))
        if name.startswith("vq_attention_partial"):
            return _RaggedPartial(ns, name, input_names)
        if name.startswith("vq_attention_combine"):
            return _Combine(ns, name.endswith("_a"))
        assert name.startswith("vq_append"), f"unexpected launch {name}"
        return _Append(ns, name, input_names)

    install_backend(monkeypatch, cuda_kernel)
    yield ns
    release_backend()


def _singles(make, lengths, seeds):
    """Each row's single cache on the MLX ops path (no kernels), after each step (one per seed of kv):
    (dequantized keys, values, records) per row."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(backend, "available", lambda: (False, "the ops path"))
        singles = filled_with(make, lengths, seed=7)
        out = []
        for seed in seeds:
            k, v = kv(1, seed, b=len(lengths))
            per = []
            for i, c in enumerate(singles):
                c.update_and_fetch(k[i:i + 1], v[i:i + 1])
                per.append((np.array(c._k.dequantized()), np.array(c._v.dequantized()), c._k.record(), c._v.record()))
            out.append(per)
        return out


CASES = [("R0", 0, [37, 50, 64, 21]), ("R8", 8, [37, 50, 64, 5])]


@pytest.mark.parametrize("window, lengths", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_ragged_batch_steps_through_the_fused_decode_step(bodies, window, lengths):
    flushed = _steps(window, lengths)
    assert bodies.appends == 1, f"{bodies.appends} append launches alone (the plan's first step only)"
    assert flushed == set(range(len(lengths))), f"the steps flushed rows {sorted(flushed)} only"
    fused_steps = [x for x in bodies.launches if x["key"][6]]
    assert len(fused_steps) == G + 1 and all(x["key"][7] for x in fused_steps), bodies.launches


@pytest.mark.parametrize("window, lengths", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_ragged_batch_steps_through_the_fused_decode_step_on_the_gpu(window, lengths, tune):
    """The same steps on a CUDA GPU (MLX's CUDA build): the kernels compiled and launched by MLX."""
    if not backend.available()[0] or backend.backend() != "cuda":
        pytest.skip("no CUDA GPU backend here")
    tune(ragged=True)
    assert _steps(window, lengths) == set(range(len(lengths)))


def _steps(window: int, lengths: list) -> set:
    """G + 2 decode steps of the ragged batch of `lengths` (KIVI 2-bit, G = 16, window R) against each row's single
    cache (see the module); returns the rows that flushed."""
    return fused_steps(lambda: vc.KIVIKVCache(bits=2, group_size=G, seed=2, layer=1, window=window), lengths, G + 2)


def fused_steps(make, lengths: list, steps: int, role: str = "_k", between=None) -> set:
    """`steps` decode steps of the ragged batch merged from `make`'s single caches of `lengths`, each row's bytes and
    output checked against its single cache after every step (_step; `between`: called with the batch between the
    append and the attention), every step but the first a DecodeStep; the rows whose `role` stream ("_k" or "_v")
    flushed."""
    want = _singles(make, lengths, [900 + s for s in range(steps)])
    batch = vc.VeloxKVCache.merge(filled_with(make, lengths, seed=7))
    assert ragged.is_ragged(batch.inner), "not one ragged B-row cache"
    flushed = set()
    for step in range(steps):
        before = getattr(batch.inner, role).bounds()
        kk = _step(batch, 900 + step, want[step], f"step {step}", between=between)
        assert (kk.step is not None) == (step > 0), f"step {step}: DecodeStep {kk.step}"
        flushed.update(i for i, (b0, b1) in enumerate(zip(before, getattr(batch.inner, role).bounds())) if b1 > b0)
    return flushed


def compiled_kernels(monkeypatch) -> list:
    """(kind, arguments by name) of every kernels.attention._compiled call from here on: the kernels a GPU run
    compiles. By name, so that a knob added to the compiled key shifts nothing read here."""
    names = []
    compiled = katt._compiled
    sig = inspect.signature(compiled)

    def record(kind, *args):
        bound = sig.bind(kind, *args)
        bound.apply_defaults()
        names.append((kind, bound.arguments))
        return compiled(kind, *args)
    monkeypatch.setattr(katt, "_compiled", record)
    return names


def fused_partials(monkeypatch, make, lengths: list, g: int, role: str) -> list:
    """G + 2 fused_steps (each row's bytes and output its single cache's after every step) with every row's `role`
    stream flushing; the compile arguments of the partials with the append inside that they launched."""
    names = compiled_kernels(monkeypatch)
    flushed = fused_steps(make, lengths, g + 2, role=role)
    assert flushed == set(range(len(lengths))), f"the steps flushed rows {sorted(flushed)} only"
    return [a for kind, a in names if kind == "partial" and a["append"]]


def flushing_steps(bodies, make, lengths: list, steps: int, role: str, inside: bool, haswin: int) -> None:
    """`steps` fused_steps (each row's bytes and output its single cache's after every step) with every row's `role`
    stream flushing; the first step's append the kernel's own launch, every later one inside the ragged MIXED
    partial unless `inside` is off (tuning's fuse_append); every partial launch ragged, of HASWIN `haswin`."""
    flushed = fused_steps(make, lengths, steps, role=role)
    assert flushed == set(range(len(lengths))), f"the steps flushed rows {sorted(flushed)} only"
    assert bodies.appends == (1 if inside else steps), f"{bodies.appends} append launches alone"
    fused_ = [x for x in bodies.launches if x["key"][6]]
    assert len(fused_) == (steps - 1 if inside else 0), sorted({x["key"] for x in bodies.launches})
    assert len(bodies.launches) == steps and all(x["key"][2] == haswin and x["key"][7] and x["key"][-1]
                                                 for x in bodies.launches), sorted({x["key"] for x in bodies.launches})


def _step(batch, seed: int, want: list, when: str, bad: bool = False, between=None):
    """One decode step (kv's chunk of `seed`; `bad`: row 1's keys NaN) and its attention; unless `bad`, each row
    checked against `want` (its single cache's state after the same step). Returns the step's keys (a PackedKV)."""
    b = len(want)
    k, v = kv(1, seed, b=b)
    if bad:
        k = mx.concatenate([k[:1], mx.full(k[1:2].shape, float("nan"), dtype=k.dtype), k[2:]])
    q = mx.random.normal((b, REP * H, 1, D), key=mx.random.key(seed)).astype(mx.float16)
    mask = masks.row_starts(batch.make_mask(1))
    kk, vv = batch.update_and_fetch(k, v)
    if between is not None:
        between(batch)
    out = np.array(vattention.attend(q, kk, vv, D ** -0.5, mask).astype(mx.float32))
    if bad:
        return kk
    ks, vs, lp = batch.inner._k, batch.inner._v, batch.left_padding.tolist()
    rows_like_singles(want, lambda i: (ks.row(i), vs.row(i)), q, out, when, lp)
    return kk


def rows_like_singles(want: list, rows, q, out, when: str, padding: list | None = None) -> None:
    """Each row's stored bytes, per role, those of its single cache (`want`: (dequantized keys, values, records) per
    row, as _singles makes them; rows(i): row i's (keys' fields, values' fields) from its first position), and its
    output `out` of queries `q` within the emulated tests' tolerance of float64 over that single cache; `padding`
    (each row's left padding) named in a failure."""
    for i, (kd, vd, krec, vrec) in enumerate(want):
        pad = "" if padding is None else f" (padding {padding[i]})"
        for role, rec, mine in zip("kv", (krec, vrec), rows(i)):
            for name, a in rec.items():
                assert np.array_equal(np.array(mine[name]).view(np.uint8), np.array(a).view(np.uint8)), \
                    f"{when}: row {i}{pad} {role} {name} differs from its single cache's"
        ref = f64_attention(np.array(q[i:i + 1].astype(mx.float32)), kd, vd, D ** -0.5, False)
        np.testing.assert_allclose(out[i:i + 1], ref, rtol=0, atol=2e-3 * np.abs(ref).max(),
                                   err_msg=f"{when}: row {i} vs float64 over its single cache")


def test_a_rejected_fused_step_rolls_every_row_back(bodies):
    """A NaN in one row's keys, stored by a fused step (inside the partial launch): the deferred check raises at a
    later step with every row back before that chunk (marks over the in-place buffers), and the steps after it (a new
    plan: one append launched alone, then fused ones) keep each row its single cache's bytes."""
    # (the bad step moves the rows' least boundary, 46 -> 48: the window's first row moves)
    make = lambda: vc.KIVIKVCache(bits=2, group_size=G, seed=2, layer=1, window=8)   # noqa: E731
    rollback_case(bodies, make, [37, 50, 64, 5], vc.KIVIKVCache.merge)


def rollback_case(bodies, make, lengths: list, merge, plan=None) -> None:
    """The rollback test of a ragged batch merged (`merge`) from `make`'s single caches of `lengths` (at most 64
    tokens): five good steps (then the in-place plan an instance of `plan`, where given), a step with a NaN in row 1's
    keys that takes the fused step, later steps until the deferred check raises with every row back before that chunk
    (marks over the in-place buffers), then G steps of a new plan with each row's bytes and output its single
    cache's."""
    good = 5
    seeds = [900 + n for n in range(good)] + list(range(910, 910 + G))
    want = _singles(make, lengths, seeds)
    batch = merge(filled_with(make, lengths, seed=7))
    for n in range(good):
        _step(batch, seeds[n], want[n], f"step {n}")
    if plan is not None:
        assert isinstance(batch.inner._in_place, plan), batch.inner._in_place
    kk = _step(batch, 905, want[0], "the bad step", bad=True)
    assert kk.step is not None, "the bad chunk did not take the fused step"
    with pytest.raises(ValueError, match="keys"):
        for s in range(3):
            batch.update_and_fetch(*kv(1, 906 + s, b=len(lengths)))
        batch.check()
    assert batch.offset.tolist() == [64 + good - p for p in batch.left_padding.tolist()]
    for n in range(good, len(seeds)):
        _step(batch, seeds[n], want[n], f"step {n} after the rollback")
    # (the first plan's, the new plan's, and a pending append the raising update flushed: DecodeStep.flush)
    assert bodies.appends >= 2, f"{bodies.appends} append launches alone"


def test_a_mixed_ragged_batch_stores_its_rows_in_place_on_the_general_path(bodies, monkeypatch):
    """Keys turboquant 3-bit beside values KIVI 2-bit, window 8 in both roles, on the general path (its in-place plan,
    ragged_step.RaggedMixedWindowsInPlace, refused here: the general path's append, attention through the ragged MIXED
    partial, its body here): on a GPU's general path the flushed rows go through the checks' commit launch into the
    fields' own arrays (RaggedStream.commit's `writes`; here its body, test_window_step._Commit), so each field's
    array is made at most once more (when it first grows, with room) instead of copied at every flush; each row's
    bytes stay its single cache's after every step."""
    # (the ops path's decode of every row's tokens: accelerated.ops' bytes, no decode kernel stood in here)
    monkeypatch.setattr(km.KernelMethod, "decode_tokens",
                        lambda self, fields, p, d: ops.method_module(p.method).decode_tokens(fields, p, d))
    monkeypatch.setattr(ragged_step.RaggedMixedWindowsInPlace, "check", classmethod(lambda *a: None))
    lengths = [37, 50, 64, 21]
    make = lambda: vc.VeloxKVCache(key_method="turboquant", key_bits=3, value_method="kivi",   # noqa: E731
                                   value_bits=2, group_size=G, seed=2, layer=1, window=8)
    seeds = [900 + s for s in range(2 * G + 2)]      # (every phase flushes twice: once growing, once in place)
    want = _singles(make, lengths, seeds)
    batch = vc.VeloxKVCache.merge(filled_with(make, lengths, seed=7))
    assert ragged.is_ragged(batch.inner), "not one ragged B-row cache"
    seen: dict = {}

    def note():
        for role, s in (("k", batch.inner._k), ("v", batch.inner._v)):
            for name, a in s._f.items():
                seen.setdefault((role, name), []).append(a)
    note()          # (the merge's arrays, exactly as large as the rows need)
    for n, seed in enumerate(seeds):
        kk = _step(batch, seed, want[n], f"step {n}")
        assert kk.step is None, "a mixed ragged pair took a DecodeStep"
        note()
    assert len(bodies.launches) == len(seeds) and all(x["key"][2] == 4 and x["key"][-1] for x in bodies.launches), \
        f"not one ragged MIXED partial (HASWIN 4) per step: {sorted({x['key'] for x in bodies.launches})}"
    made = {key: len({id(a) for a in arrays}) for key, arrays in seen.items()}
    assert all(m <= 2 for m in made.values()), f"field arrays made per field over {len(seeds)} steps: {made}"
    assert made[("k", "codes")] == 2, made       # (the keys flush every step: one growth, then in place)


def test_a_ragged_batch_steps_with_the_append_launched_alone(bodies, tune):
    """tuning's fuse_append off (Metal's way, and a knob on CUDA): every step's append is the ragged append kernel's
    own launch (kernels/append.py with rphase), then the ragged partial without it; the same bytes per row and
    outputs."""
    tune(fuse_append=False)
    window, lengths = CASES[1][1:]
    assert _steps(window, lengths) == set(range(len(lengths)))
    assert bodies.appends == G + 2, f"{bodies.appends} append launches alone for {G + 2} steps"
    assert bodies.launches and not any(x["key"][6] for x in bodies.launches), "a partial launch with the append"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_ragged_append_compiles(tmp_path):
    """The ragged append kernel (kernels/append.py with rphase: KIVI 2-bit both roles, windows) as
    mx.fast.cuda_kernel wraps it, in both role layouts: compiles for sm_90 without spills."""
    from veloxquant import spec
    kp, vp = (spec.Params("kivi", bits=2, group_size=32, window=8, role=r).resolved() for r in "kv")
    append_compiles(tmp_path, "append_ragged", kp, vp, True)


def append_compiles(tmp_path, stem: str, kp, vp, win) -> None:
    """The ragged append kernel (kernels/append.py with rphase) for kp / vp, d = 128, with the roles' windows `win`
    (True: both; else (keys', values')) as mx.fast.cuda_kernel wraps it, in both role layouts (kernels named
    {stem}_0 and _1): compiles for sm_90 without spills."""
    import subprocess
    import test_attention_kernels_source as tas
    from veloxquant.accelerated import tuning
    from veloxquant.accelerated.kernels import source
    mk, mv = kp.method, vp.method
    kwin, vwin = (win, win) if win is True else win
    body, header = "", ""
    for apart in (False, True):
        header, text = fused.assemble("cuda", mk, mv, apart, win, True)
        names = fused.inputs(mk, mv, win, True)
        types = {n: "int32_t" if n in ("base", "vbase", "rphase") else "bool" if n in ("after", "flags") else
                 "uint32_t" if n.endswith(("const", "codes1", "codes2")) else "__half" for n in names + ["flags"]}
        body += tas._kernel(f"{stem}_{int(apart)}", text, names, fused.OUTPUTS, types,
                            [("KM", source.METHOD_IDS[mk]), ("VM", source.METHOD_IDS[mv]), ("D", 128),
                             ("KTS", "__half"), ("VTS", "__half"), *([("KXT", "__half")] if kwin else []),
                             *([("VXT", "__half")] if vwin else []),
                             *fused.code_template(kp, vp, tuning.DEFAULT.specialize_rows)])
        body += "#undef VQ_OROW\n#define VQ_OROW(bh, ne, i) ((bh) * (ne) + (i))\n#undef VQ_ROW_ENCODES\n"
    text = (CUDA_UNIT_PRELUDE + header + "namespace mlx::core::cu {\n" + body + "}\n")
    f = tmp_path / f"{stem}.cu"
    f.write_text(text)
    r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", "-cubin", str(f), "-o",
                        str(tmp_path / f"{stem}.cubin")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stderr.count(" 0 bytes spill stores") == 2 and r.stderr.count(f"{stem}_") >= 2, r.stderr[-2000:]


@pytest.mark.parametrize("window", [0, 128], ids=["R0", "R128"])
def test_the_ragged_batch_checks_hold_through_the_fused_decode_step(bodies, window, tmp_path):
    """test_batch_ragged_kivi's bytes-per-row checks (merge, G + 3 steps with every row's flush, filter, extend,
    save/load) with the fused decode step the GPU takes (each step's append pending until something reads the rows)
    instead of the ops path."""
    rk.test_a_ragged_kivi_batch_is_one_cache_with_each_sequences_bytes(False, window, tmp_path)
