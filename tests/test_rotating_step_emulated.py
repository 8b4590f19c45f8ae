"""The sliding-window cache's decode step (issue 29 item 4) with the attention launches run by the kernel BODIES on
the CPU (tests/test_attention_kernels_emulated.py's emulation: one fiber per GPU thread, the partial and the
combine compiled from accelerated/kernels/csrc as the launch's key and template say). Everything else is the library's
own: VeloxRotatingKVCache evicts (Stream.evict: rows below lo skipped), DecodeStep plans the launch (the whole buffers,
nenc = lo + Q, the row start moved past lo: decode_step._past_evicted; KIVI's group fields from row lo / G), and with
tuning's fuse_append the step's append runs inside the partial launch: the body encodes the tokens leaving each exact
window into the cache's own buffers (numpy views of them, so its writes land where a GPU's would) and copies the chunk
into the window, which the same launch attends. The append launched alone and a buffer growth's commit are stood in by
accelerated.ops' bytes (tests/test_window_step.py's _Append and _Commit); prefill encodes through ops.

Each step's output is checked against accelerated.ops' attention over exactly the tokens mlx-lm's RotatingKVCache
attends (one-shot records of the held tokens, KIVI's up to G - 1 older ones hidden by a row start) and float64 over
their decode, within the tolerance tier the emulation tests use; the stored records against one-shot encode of the held
tokens, bit for bit. Controls that must fail: the launch's row start one row off (set so by the host, or read so by
the body) and a body whose row start also masks the exact window.

What the emulation does not run: the tensor-core loop here (tests/test_attention_kernels_emulated.py emulates it
apart), MLX's launch and the GPU's memory model; a GPU run checks those (tests/test_decode_step.py's gpu tests).
"""
from __future__ import annotations

import ctypes
import re
import shutil
import types

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base
from mlx_lm.models.cache import RotatingKVCache

from veloxquant.accelerated import kernels, ops, tuning
from veloxquant.accelerated.cache import VeloxRotatingKVCache
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import backend, decode_step
from veloxquant.accelerated.ops import attention as oatt
from _attention_util import f64_attention
from test_attention_kernels_emulated import CTYPES, _compile, _marshal, _source
from test_rotating_step import D, HQ, _x, install_backend, release_backend
from test_window_step import _Append, _Commit



def _shared(a: mx.array) -> np.ndarray:
    """A numpy array sharing `a`'s memory (a view into a buffer included): the body's in-place writes land there."""
    mx.eval(a)
    if a.size == 0:
        return np.zeros(a.shape, np.dtype(np.float16) if a.dtype == mx.float16 else np.float32)
    assert a.dtype != mx.bfloat16, "float16 and float32 caches only here"
    return np.array(memoryview(a), copy=False)


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def _key(name: str) -> tuple:
    """kernels.attention._static's key (mk, mv, haswin, fused, tc, tc_blocks, append, starts) from _compiled's name."""
    tag = name.removeprefix("vq_attention_partial_").split("_")[0]
    mk, mv, haswin, fused_, rest = int(tag[0]), int(tag[1]), int(tag[2]), int(tag[3]), tag[4:]
    tc = rest.startswith("t")
    blocks = int(re.match(r"t(\d*)", rest).group(1) or 0) if tc else 0
    if tc and ("mx" in rest or "mk" in rest or "c3" in rest):     # (TC_MIX's, TC_MIXK's or TC_TENS's loop: tags)
        tc = katt.src.TC_MIX if "mx" in rest else katt.src.TC_MIXK if "mk" in rest else katt.src.TC_TENS
        rest = rest.replace("mx", "").replace("mk", "").replace("c3", "")
    whole = (False, True) if rest.endswith("b") else ()      # (tuning's whole_windows: _static's key ends so)
    return (mk, mv, haswin, fused_, tc, blocks, "a" in rest, "r" in rest) + whole


class _Partial:
    """The partial launch run by its body (the emulation's library for this key and template), recording each
    launch's key and row start."""

    def __init__(self, ns, name, names):
        self.ns, self.key, self.names = ns, _key(name), list(names)

    def specialized(self, template=None):
        return self

    def __call__(self, *, inputs, template, grid, threadgroup, output_shapes, output_dtypes, **kw):
        t = dict(template)
        d = t["D"]
        plan = types.SimpleNamespace(key=self.key, partial_names=self.names, partial_template=template, fused=False,
                                     combine_template=[("MV", t["MV"]), ("D", d),
                                                       ("CNT", max(d, tuning.current().combine_threads))])
        assert not self.key[3], "the decode step launches the combine on its own"
        text = _source(plan, {n: CTYPES[a.dtype] for n, a in zip(self.names, inputs)}, CTYPES[t["OT"]])
        if self.ns.edit is not None:      # a deliberately broken body (the controls)
            old, new = self.ns.edit
            assert text.count(old) == 1, f"the body no longer reads {old!r}"
            text = text.replace(old, new)
        lib = _compile(text)
        self.ns.lib, self.ns.append = lib, self.key[6]
        ins = [_shared(a) for a in inputs]
        a = dict(zip(self.names, ins))
        self.ns.launches.append({"key": self.key, "nenc": int(a["nenc"].reshape(-1)[0]),
                                 "rstart": int(a["rstart"].reshape(-1)[0]) if "rstart" in a else 0,
                                 # (tuning's whole_windows: the keys' window rows in wrow[3], csrc/window_bind.h)
                                 "window": a["kw"].shape[2] if "kw" in a else int(a["wrow"][3]) if "wrow" in a
                                 else 0})
        o_acc = np.full(output_shapes[0], np.nan, np.float32)
        o_ml = np.full(output_shapes[1], np.nan, np.float32)
        token = np.ones(output_shapes[2], np.bool_) if self.key[6] else np.zeros(1, np.bool_)
        ptrs, sh, st = _marshal(ins)
        nt = t["NT"]
        assert threadgroup[0] == nt
        lib.run_partial(ptrs, *map(_ptr, (sh, st, o_acc, o_ml, token)), nt, grid[0] // nt, grid[1], grid[2])
        return [mx.array(o_acc), mx.array(o_ml)] + ([mx.array(token)] if self.key[6] else [])


class _Combine:
    """The combine launch, from the library of the partial launched just before it."""

    def __init__(self, ns, append):
        self.ns, self.append = ns, append

    def specialized(self, template=None):
        return self

    def __call__(self, *, inputs, template, grid, threadgroup, output_shapes, output_dtypes, **kw):
        assert self.append == self.ns.append, "a combine with a summary after a partial without the append"
        ins = [_shared(a) for a in inputs]
        out = np.zeros(output_shapes[0], np.float16 if output_dtypes[0] == mx.float16 else np.float32)
        summary = np.ones((2, 1, 2), np.bool_)
        ptrs, sh, st = _marshal(ins)
        n = threadgroup[0]
        self.ns.lib.run_combine(ptrs, *map(_ptr, (sh, st, out)), n, grid[0] // n, grid[1], grid[2], _ptr(summary))
        return [mx.array(out)] + ([mx.array(summary)] if self.append else [])


@pytest.fixture
def bodies(monkeypatch, tune):
    """A "CUDA" backend whose attention launches run the kernel bodies (the append inside the partial included);
    the append launched alone and the commit as their bodies compute them; no encode kernel (prefill through ops)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed: no CPU emulation")
    ns = types.SimpleNamespace(params=None, launches=[], lib=None, append=False, edit=None)
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("cuda", "CPU emulation of the bodies"))
    monkeypatch.setattr(backend, "available", lambda: (True, "CPU emulation of the bodies"))
    monkeypatch.setattr(kernels, "available", lambda: (True, "CPU emulation of the bodies"))
    monkeypatch.setattr(katt, "_mma_available", lambda: False)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    # the append inside the partial (CUDA's default), the combine its own launch (what the append needs); splits of
    # 8 tokens, so that the row start falls inside and past whole splits; small combine threadgroups (CPU threads)
    tune(fuse_append=True, fuse_combine=False, tokens_per_split=8, combine_threads=D)

    def cuda_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True):
        if name.startswith("vq_commit"):
            return _Commit(list(input_names))
        if name.startswith("vq_attention_partial"):
            return _Partial(ns, name, input_names)
        if name.startswith("vq_attention_combine"):
            return _Combine(ns, name.endswith("_a"))
        assert name.startswith("vq_append") and name.endswith(("_w", "_w_b")), f"unexpected launch {name}"
        return _Append(ns.params, list(input_names))

    install_backend(monkeypatch, cuda_kernel)
    yield ns
    release_backend()


def _packed(x: mx.array, p) -> oatt.PackedRecord:
    rec = ops.encode(x, p)
    return oatt.PackedRecord(p, {n: a for n, a in rec.items() if n != "window"}, rec["window"],
                             x.shape[2] - rec["window"].shape[2], ops.method_module(p.method).decode_tokens)


def _expected(c, ks, vs, q, n_ref):
    """accelerated.ops' attention over the held tokens' one-shot records from the first one mlx-lm attends, and
    float64 over their decode; the tolerance tier's budget (float16 outputs)."""
    held = c._k.tokens
    k = _packed(mx.concatenate(ks, axis=2)[:, :, -held:], c.key_params)
    v = _packed(mx.concatenate(vs, axis=2)[:, :, -held:], c.value_params)
    for rec, s in ((k, c._k), (v, c._v)):      # what the cache stores is one-shot encode's of the held tokens
        got = s.record()
        assert all(np.array_equal(np.array(got[n]), np.array(a)) for n, a in rec.fields.items()), "stored records"
        assert np.array_equal(np.array(got["window"]), np.array(rec.window)), "stored window"
    s0 = held - n_ref
    mask = oatt.RowStarts(mx.array([s0], dtype=mx.int32), False, None, (s0,)) if s0 else None
    ops_out = np.array(oatt.attention(q, k, v, D ** -0.5, mask).astype(mx.float32))
    f64 = f64_attention(np.array(q.astype(mx.float32)), np.array(k.dequantized())[:, :, s0:],
                        np.array(v.dequantized())[:, :, s0:], D ** -0.5, False)
    return ops_out, f64, 2e-3 * np.abs(f64).max(), s0


def _run(ns, kw, max_size, steps):
    """Prefill 5 tokens, then `steps` one-token steps past max_size (every step evicts): each step's output checked
    against _expected. Returns the cache, the launches with the append inside, a row start and a window (nenc, row
    start, the held tokens mlx-lm no longer attends) and the steps off the decode step. `ns` None: the real kernels
    (a GPU; launches not recorded: those of steps on the decode step with a row start)."""
    c = VeloxRotatingKVCache(max_size, layer=0, seed=3, **kw)
    ref = RotatingKVCache(max_size)
    if ns is not None:
        ns.params = (c.key_params, c.value_params)
    ks, vs = [_x(7, t=5)], [_x(8, t=5)]
    c.update_and_fetch(ks[0], vs[0])
    ref.update_and_fetch(ks[0], vs[0])
    seen, off = [], []
    for i in range(steps):
        mask = c.make_mask(1)
        ks.append(_x(2 * i))
        vs.append(_x(2 * i + 1))
        if ns is not None:
            ns.launches.clear()
        kk, vv = c.update_and_fetch(ks[-1], vs[-1])
        ref.update_and_fetch(ks[-1], vs[-1])
        q = _x(900 + i, h=HQ)
        out = base.scaled_dot_product_attention(q, kk, vv, cache=c, scale=D ** -0.5, mask=mask)
        got = np.array(out.astype(mx.float32))
        fast = c._fast is not None and c._fast.k is c._k and kk.step is c._fast
        if ns is None:
            lo = max(r.lo for r in c._k._rows.values())     # (KIVI keys' group fields: lo / G)
            launch = dict(nenc=lo + c._k._q, window=c._k._window.shape[2] if c._k._window is not None else 0)
            launch.update(key=(fast,) * 8)
        elif ns.launches:
            (launch,) = ns.launches
        else:
            launch = None
        if launch is None or not c._k._q:        # nothing encoded yet (a window-only record): the ops path
            assert c._k._q == 0 and c._v._q == 0, f"step {i}: no attention launch with encoded tokens"
            continue
        ops_out, f64, tol, s0 = _expected(c, ks, vs, q, ref.size())
        if ns is None:
            launch["rstart"] = launch["nenc"] - c._k._q + s0
        where = f"step {i}: launch {launch}, held {c._k.tokens}, mlx-lm's {ref.size()}"
        np.testing.assert_allclose(got, f64, rtol=0, atol=tol, err_msg=f"{where}: kernel bodies vs float64")
        np.testing.assert_allclose(got, ops_out, rtol=0, atol=2 * tol, err_msg=f"{where}: kernel bodies vs ops")
        if launch["key"][6] and launch["rstart"] and launch["window"]:
            seen.append((launch["nenc"], launch["rstart"], s0))
        if not fast:
            off.append(i)
    return c, seen, off


CASES = [
    ("turboquant-w4", dict(method="turboquant", bits=4, window=4), 24, 40),
    ("kivi-w4", dict(method="kivi", bits=2, group_size=16, window=4), 40, 72),
]


def _check_steps(name, kw, seen, off):
    assert max(off) < 16, f"{name}: steps off the decode step {off}"
    lo = [(n, r - s0) for n, r, s0 in seen]     # (nenc, evicted rows lo) of launches with the append, start, window
    assert len(seen) >= 16 and sum(e > 0 for _, e in lo) >= 8, f"{name}: too few launches past evicted rows {seen}"
    if kw["method"] == "kivi":      # evicted rows are whole groups; the mask's start hides the rest (up to G - 1)
        g = kw["group_size"]
        assert all(e % g == 0 for _, e in lo) and {s0 for *_, s0 in seen} == set(range(g)), seen
        flushed = [b for a, b in zip(lo, lo[1:]) if b[0] > a[0]]     # a group encoded by the launch's append
        assert any(e > 0 for _, e in flushed), f"{name}: no flush inside a launch past evicted rows {seen}"


@pytest.mark.parametrize("whole", [False, True], ids=["views", "whole-windows"])
@pytest.mark.parametrize("name,kw,max_size,steps", CASES, ids=[c[0] for c in CASES])
def test_kernel_bodies_attend_the_sliding_windows_held_tokens(bodies, tune, name, kw, max_size, steps, whole):
    """Past max_size every step evicts: the launch's bodies (append inside, row start past the evicted rows, the exact
    window in the same launch) give the output of ops' attention over the held tokens, step after step, and store
    one-shot encode's bytes (KIVI: its group flushes inside launches that read from a row start past whole groups).
    `whole`: tuning's whole_windows (the window buffers whole and their rows, csrc/window_bind.h)."""
    tune(whole_windows=whole)
    _check_steps(name, kw, *_run(bodies, kw, max_size, steps)[1:])
    steps = [x for x in bodies.launches if x["key"][6]]        # (the decode steps': the append inside)
    assert steps and all((len(x["key"]) > 9) == whole for x in steps), "whole_windows: the decode steps' kernels"


TC_CASES = [("mlx_affine-w4", dict(method="mlx_affine", bits=4, group_size=32, window=4), 24, 40)]


@pytest.mark.parametrize("whole", [False, True], ids=["views", "whole-windows"])
@pytest.mark.parametrize("name,kw,max_size,steps", TC_CASES, ids=[c[0] for c in TC_CASES])
def test_kernel_bodies_attend_the_held_tokens_on_the_tensor_core_loop(bodies, monkeypatch, tune, name, kw, max_size,
                                                                      steps, whole):
    """The check above with the partial's tensor-core loop (tuning's tc_affine): the append inside, the row start past
    the evicted rows and the exact window's split of the same launch around the mma loop's chunks (csrc/tc_window.h;
    `whole`: its kw / vw bound to rows of the whole buffers)."""
    tune(whole_windows=whole)
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    _check_steps(name, kw, *_run(bodies, kw, max_size, steps)[1:])
    assert bodies.launches and all(launch["key"][4] for launch in bodies.launches), "not the tensor-core loop"


@pytest.mark.skipif(not kernels.available()[0], reason=f"needs the GPU kernels: {kernels.available()[1]}")
@pytest.mark.parametrize("name,kw,max_size,steps", CASES + TC_CASES, ids=[c[0] for c in CASES + TC_CASES])
@pytest.mark.parametrize("whole", [False, True], ids=["views", "whole-windows"])
def test_gpu_sliding_window_decode_step_attends_the_held_tokens(tune, name, kw, max_size, steps, whole):
    """The same steps with the real kernels (CUDA: the append inside the partial launch, tuning's default): outputs
    within the same budget of ops' attention over the held tokens, stored bytes one-shot encode's (`whole`: tuning's
    whole_windows)."""
    tune(tokens_per_split=8, whole_windows=whole)
    _check_steps(name, kw, *_run(None, kw, max_size, steps)[1:])


CONTROLS = [
    ("host-start+1", 0, None),
    ("body-start+1", 1, ("vq_min((int)rstart[b], QO)", "vq_min((int)rstart[b] + 1, QO)")),
    ("body-window-masked-by-start", 0, ("int t1 = vq_min(RK, RV);", "int t1 = VQ_STARTS ? 0 : vq_min(RK, RV);")),
]


@pytest.mark.parametrize("name,case,edit", CONTROLS, ids=[c[0] for c in CONTROLS])
def test_a_broken_row_start_fails(bodies, monkeypatch, name, case, edit):
    """The controls of the check above, which must fail: the launch's row start one row past the evicted rows (the
    oldest held token skipped), set so by the host (decode_step._past_evicted) or read so by the body; and a body
    whose row start also masks the exact window (the window split attends nothing where the launch has starts)."""
    if edit is None:
        real = decode_step._past_evicted

        def off_by_one(b, keys, values, mask):
            m, held, below = real(b, keys, values, mask)
            return (oatt.RowStarts(m.starts + 1, m.causal) if keys.lo else m), held, below
        monkeypatch.setattr(decode_step, "_past_evicted", off_by_one)
    bodies.edit = edit
    with pytest.raises(AssertionError, match="kernel bodies vs float64"):
        _run(bodies, *CASES[case][1:])
