"""accelerated.kernels.append's kernel text on the CPU (the emulator of tests/_kernel_emulator.py): both roles'
new tokens encoded by source.py's body and stored in place at rows base..base+t-1 of buffers with spare
capacity, bit for bit the fields one-shot encode stores (accelerated.ops), rows outside untouched, and each
fault in its own slot of the token ([role][group][NaN/Inf, rule]). The GPU side (the launch, MLX's
signature) runs in tests/test_kernels_gpu.py on a GPU."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import ops, tuning
from veloxquant.accelerated.kernels import append as fused
from veloxquant.accelerated.kernels import methods as km
from veloxquant.accelerated.kernels import source

import _kernel_emulator as ke   # noqa: E402  (tests/ is on sys.path under pytest)
from _attention_util import CUDA_UNIT_PRELUDE

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

D = 64
# (key method, value method, x type, key TS, value TS): every method of the fused path in each role
PAIRS = [("turboquant", "turboquant", "float16"), ("turboquant_rvq", "turboquant_prod", "bfloat16"),
         ("rabitq", "mlx_affine", "float16"), ("turboquant_prod", "rabitq", "float32"),
         ("mlx_affine", "turboquant_rvq", "float32")]
KW = {"turboquant": dict(bits=3), "turboquant_rvq": dict(bits=2, bits2=3), "turboquant_prod": dict(bits=4),
      "rabitq": dict(), "mlx_affine": dict(bits=4, group_size=32), "kivi": dict(bits=2, group_size=16)}
_C = {"float32": "float", "float16": "_Float16", "bfloat16": "vq_bf16"}


ROWS = tuning.DEFAULT.specialize_rows   # the compile checks build the specialized launch (code constants compiled in)
# the emulated kernels: every pair with the roles apart and serial, and apart with exact windows (fused.WINDOWED)
_VARIANTS = [(*pair, apart, False) for apart in (True, False) for pair in PAIRS] + [(*pair, True, True) for pair in PAIRS]
# KIVI with an exact window (fused.applies): the group flush inside the windowed launch, both role layouts
KIVI_PAIRS = [("kivi", "kivi", "float16"), ("kivi", "kivi", "bfloat16")]
_VARIANTS += [(*pair, apart, True) for apart in (True, False) for pair in KIVI_PAIRS]
# one role with a window and the other none (fused.MIXED): keys turboquant 3-bit (R = 0) beside KIVI 2-bit values
# (groups of 32: the recommended quality configuration), keys turboquant 4-bit with a window beside rabitq values
MIXED_KW = {("turboquant", "kivi"): (dict(bits=3), dict(bits=2, group_size=32)),
            ("turboquant", "rabitq"): (dict(bits=4), dict())}
MIXED_VARIANTS = [("turboquant", "kivi", "float16", True, (False, True)),
                  ("turboquant", "kivi", "bfloat16", False, (False, True)),
                  ("turboquant", "rabitq", "float16", True, (True, False)),
                  ("turboquant", "kivi", "float16", True, (True, True))]    # both windowed: R and KIVI's R .. R + G - 1
_VARIANTS += MIXED_VARIANTS
_WIN_INPUTS = ("kf", "kw", "vf", "vw")


def _params(method: str) -> spec.Params:
    """The parameters PAIRS' launches use for a method (the code constants come from them)."""
    return spec.Params(method, window=0, **KW[method]).resolved()


def _ts(method: str, xt: str) -> str:
    return xt if method == "mlx_affine" else "float16" if method == "kivi" else "float32"


def _ctype(name: str, xt: str, tk: str, tv: str) -> str:
    if name in ("base", "vbase"):
        return "int32_t"
    if name == "after":
        return "bool"
    role, rest = name[0], name[1:]
    return {"x": _C[xt], "f": _C[xt], "w": _C[xt], "const": "uint32_t", "codes1": "uint32_t", "codes2": "uint32_t"}.get(
        rest, tk if role == "k" else tv)


def _source() -> str:
    """One emulated kernel per pair: the parameters MLX would pass for fused.inputs(mk, mv), then the text."""
    head = (ke.HARNESS.replace("@ENCODE@", ke.PRELUDE + source.ENCODE_BODY)
            .replace("@DECODE@", ke.PRELUDE + source.DECODE_BODY)
            .replace("@ENC_DISPATCH@", "").replace("@DEC_DISPATCH@", ""))
    text = head + "#define VQ_DEV\n#define VQ_TG\n#define VQ_REF const auto&\n#define VQ_MUT(type, p) const_cast<type*>(p)\n"
    calls = []
    for i, (mk, mv, xt, apart, win) in enumerate(_VARIANTS):
        tk, tv = _C[_ts(mk, xt)], _C[_ts(mv, xt)]
        names = fused.inputs(mk, mv, win)
        params, args = [], []
        for j, n in enumerate(names):
            ty = _ctype(n, xt, tk, tv)
            params.append(f"const {ty}* {n}")
            args.append(f"(const {ty}*)p[{j}]")
            if n in ("kx", "vx", "kcodes1", "vcodes1", "kf_s1", "vf_s1", *_WIN_INPUTS):
                params.append(f"Shape {n}_shape")
                args.append(f"shape_of(sh + {4 * j})")
            if n in ("kx", "vx", *_WIN_INPUTS):
                params.append(f"Strides {n}_strides")
                args.append(f"strides_of(st + {4 * j})")
        ids = (source.METHOD_IDS[mk], source.METHOD_IDS[mv])
        pk, pv = ((_params(mk), _params(mv)) if not isinstance(win, tuple) else
                  (spec.Params(m, window=0, **kw).resolved() for m, kw in zip((mk, mv), MIXED_KW[(mk, mv)])))
        codes = "".join(f"  constexpr int {n} = {v};\n" for n, v in fused.code_template(pk, pv, ROWS))
        text += (f"static void app_thread_{i}({', '.join(params)}, bool* flags) {{\n"
                 f"  constexpr int KM = {ids[0]};\n  constexpr int VM = {ids[1]};\n  constexpr int D = {D};\n{codes}"
                 f"  using KTS = {tk};\n  using VTS = {tv};\n  using KXT = {_C[xt]};\n  using VXT = {_C[xt]};\n"
                 + ke.PRELUDE + fused.body(mk, mv, apart, win) + "}\n"
                 + ("#undef GROUP\n#undef NGROUPS\n#define GROUP vq_group\n#define NGROUPS vq_ngroups\n" if apart else ""))
        calls.append(f"  if (pair == {i}) {{ run_grid(groups, warps, [&] {{ app_thread_{i}({', '.join(args)}, "
                     f"(bool*)p[{len(names)}]); }}); return 0; }}")
    return text + ("extern \"C\" int vq_append(int pair, int groups, int warps, void** p, const int64_t* sh, "
                   "const int64_t* st) {\n" + "\n".join(calls) + "\n  return 1;\n}\n")


@pytest.fixture(scope="module")
def lib():
    return ke.compile_library(_source(), "veloxquant-append")


def _x(rng, shape, xt):
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(getattr(mx, xt))


def _run(lib, kp, xk, kbufs, vp, xv, vbufs, base, groups=2, warps=2, apart=True, windows=None, nq=None, own=0,
         win=None, vbase=None):
    """The emulated launch; buffers (numpy, written in place) by field name; returns the token. `windows`: the
    numpy views kf, kw, vf, vw of a launch with exact windows (fused.WINDOWED); `nq`: the tokens it encodes where
    not the chunk's count (KIVI: 0 or G), `own` the chunk's among them (KIVI with R = 0); `win` (keys', values'),
    `vbase` and `nq` / `own` as pairs: one role with a window, the other none (fused.MIXED)."""
    arrays = {"base": np.array([base], np.int32), "after": np.zeros(1, np.bool_), **(windows or {})}
    if vbase is not None:
        arrays["vbase"] = np.array([vbase], np.int32)
    nqs, owns = (nq if isinstance(nq, tuple) else (nq, nq)), (own if isinstance(own, tuple) else (own, own))
    for r, p, x, bufs, nq_, own_ in (("k", kp, xk, kbufs, nqs[0], owns[0]), ("v", vp, xv, vbufs, nqs[1], owns[1])):
        arrays[f"{r}x"] = ke._np(x)
        arrays[f"{r}const"] = ke._np(fused.constants(p, x.shape[1], x.shape[2], x.shape[3], nq_, own_))
        for out, field in zip(("codes1", "codes2", "f_s1", "f_s2"), km.FIELDS[p.method]):
            if field:
                arrays[f"{r}{out}"] = bufs[field]
    win = (windows is not None) if win is None else win
    names = fused.inputs(kp.method, vp.method, win)
    ins = [arrays[n] for n in names]
    flags = np.zeros((2, groups, 2), np.bool_)
    ptrs = (ctypes.c_void_p * (len(ins) + 1))(*[a.ctypes.data for a in ins + [flags]])
    sh = np.zeros((len(ins), 4), np.int64)
    st = np.zeros((len(ins), 4), np.int64)
    for j, a in enumerate(ins):
        if a.ndim == 4:
            sh[j] = a.shape
            st[j] = [s_ // a.itemsize for s_ in a.strides]
    pair = _VARIANTS.index((kp.method, vp.method, ke._dtname(xk.dtype), apart, win))
    rc = lib.vq_append(pair, 2 * groups if apart else groups, warps, ptrs, ke._ptr(sh), ke._ptr(st))   # apart: a half per role
    assert rc == 0, "no instantiation"
    return flags


def _buffers(rng, want: dict, t0: int, cap: int) -> tuple[dict, dict]:
    """Buffers of `cap` rows: rows < t0 hold the prefix, the rest garbage; and a copy to compare against."""
    bufs = {}
    for n, a in want.items():
        w = ke._np(a)
        buf = rng.integers(0, 2 ** 16, (*w.shape[:2], cap, *w.shape[3:])).astype(w.dtype)
        buf[:, :, :t0] = w[:, :, :t0]
        bufs[n] = buf
    return bufs, {n: b.copy() for n, b in bufs.items()}


@pytest.mark.parametrize("apart", [True, False], ids=["roles-apart", "roles-serial"])
@pytest.mark.parametrize("mk,mv,xt", PAIRS)
@pytest.mark.parametrize("t0,t", [(5, 1), (9, 4)])
def test_append_stores_one_shot_bytes_in_place(lib, mk, mv, xt, t0, t, apart):
    rng = np.random.default_rng(t0 * 7 + t)
    kp = spec.Params(mk, role="k", window=0, seed=3, layer=2, head_offset=4, **KW[mk]).resolved()
    vp = spec.Params(mv, role="v", window=0, seed=3, layer=2, head_offset=4, **KW[mv]).resolved()
    xk, xv = _x(rng, (2, 3, t0 + t, D), xt), _x(rng, (2, 3, t0 + t, D), xt)
    wk = {n: a for n, a in ops.method_module(mk).encode(xk, kp).items() if n != "window"}
    wv = {n: a for n, a in ops.method_module(mv).encode(xv, vp).items() if n != "window"}
    cap = t0 + t + 3
    kb, k0 = _buffers(rng, wk, t0, cap)
    vb, v0 = _buffers(rng, wv, t0, cap)
    flags = _run(lib, kp, xk[:, :, t0:], kb, vp, xv[:, :, t0:], vb, t0, apart=apart)
    assert not flags.any(), f"append {mk}/{mv}: fault flags on good input: {flags.tolist()}"
    for role, bufs, want, before in (("keys", kb, wk, k0), ("values", vb, wv, v0)):
        for n, buf in bufs.items():
            w = ke._np(want[n])
            diff = np.count_nonzero(buf[:, :, : t0 + t] != w)
            assert diff == 0, f"append {mk}/{mv} {role}.{n}: {diff} of {w.size} stored elements differ from one-shot encode"
            assert np.array_equal(buf[:, :, t0 + t:], before[n][:, :, t0 + t:]), \
                f"append {mk}/{mv} {role}.{n}: rows past the chunk were written"


def test_append_fault_slots(lib):
    """NaN in the values chunk sets [values][*][NaN/Inf] only; a key norm overflowing binary32 sets
    [keys][*][rule] only."""
    rng = np.random.default_rng(1)
    kp = spec.Params("turboquant_prod", role="k", window=0, bits=4).resolved()
    vp = spec.Params("rabitq", role="v", window=0).resolved()
    xk, xv = _x(rng, (1, 4, 6, D), "float32"), _x(rng, (1, 4, 6, D), "float32")
    wk = {n: a for n, a in ops.method_module("turboquant_prod").encode(xk, kp).items() if n != "window"}
    wv = {n: a for n, a in ops.method_module("rabitq").encode(xv, vp).items() if n != "window"}
    kb, _ = _buffers(rng, wk, 5, 8)
    vb, _ = _buffers(rng, wv, 5, 8)
    xv_bad = np.array(xv[:, :, 5:])
    xv_bad[0, 2, 0, 7] = np.nan
    flags = _run(lib, kp, xk[:, :, 5:], kb, vp, mx.array(xv_bad), vb, 5)
    assert flags[1, :, 0].any() and not flags[0].any() and not flags[1, :, 1].any(), flags.tolist()
    assert [any(h) for h in fused.messages(mx.array(flags))] == [False, False, True, False]
    xk_big = np.array(xk[:, :, 5:]) * np.float32(1e30)
    flags = _run(lib, kp, mx.array(xk_big), kb, vp, xv[:, :, 5:], vb, 5)
    assert flags[0, :, 1].any() and not flags[0, :, 0].any() and not flags[1].any(), flags.tolist()


def _window_case(rng, mk, mv, xt, t0, t, r, ws):
    """A stream pair with an exact window of r tokens (T = t0 + r + t: t0 encoded, r in the window, t new): records of
    t0 rows in buffers with room, the window at rows ws..ws+r-1 of a window buffer (garbage around it), the chunk;
    and what one-shot encode of all T tokens stores (fields, window)."""
    kp = spec.Params(mk, role="k", window=r, seed=3, layer=2, head_offset=4, **KW[mk]).resolved()
    vp = spec.Params(mv, role="v", window=r, seed=3, layer=2, head_offset=4, **KW[mv]).resolved()
    xs = [_x(rng, (2, 3, t0 + r + t, D), xt) for _ in range(2)]
    case = {}
    for role, p, x in (("k", kp, xs[0]), ("v", vp, xs[1])):
        want = ops.method_module(p.method).encode(x, p)
        bufs, before = _buffers(rng, {n: a for n, a in want.items() if n != "window"}, t0, t0 + t + 3)
        xn = ke._np(x)
        wbuf = rng.standard_normal((2, 3, ws + r + t + 5, D)).astype(xn.dtype)
        wbuf[:, :, ws:ws + r] = xn[:, :, t0:t0 + r]
        case[role] = dict(p=p, chunk=x[:, :, t0 + r:], bufs=bufs, before=before, want=want, wbuf=wbuf,
                          wbefore=wbuf.copy(), views={f"{role}f": wbuf[:, :, ws:ws + t], f"{role}w": wbuf[:, :, ws + t:ws + t + r]})
    return case


@pytest.mark.parametrize("mk,mv,xt", PAIRS)
@pytest.mark.parametrize("t0,t,r,ws", [(5, 1, 3, 2), (9, 2, 32, 0), (4, 3, 3, 7), (6, 1, 1, 0)])
def test_append_with_windows_moves_them_in_place(lib, mk, mv, xt, t0, t, r, ws):
    """fused.WINDOWED (chunks of t <= R tokens: in_place.InPlace): the window's t oldest tokens are encoded into rows t0.. of the records (one-shot encode's bytes
    for the whole sequence) and the chunk is copied into the window's next t rows: the window after the step is
    one-shot encode's window, and no other row of either buffer is written."""
    rng = np.random.default_rng(t0 * 11 + t * 3 + r)
    c = _window_case(rng, mk, mv, xt, t0, t, r, ws)
    k, v = c["k"], c["v"]
    flags = _run(lib, k["p"], k["chunk"], k["bufs"], v["p"], v["chunk"], v["bufs"], t0,
                 windows={**k["views"], **v["views"]})
    assert not flags.any(), f"append {mk}/{mv} with windows: fault flags on good input: {flags.tolist()}"
    for role in ("k", "v"):
        e = c[role]
        for n, buf in e["bufs"].items():
            w = ke._np(e["want"][n])
            diff = np.count_nonzero(buf[:, :, :t0 + t] != w)
            assert diff == 0, f"{mk}/{mv} {role}.{n}: {diff} of {w.size} elements differ from one-shot encode"
            assert np.array_equal(buf[:, :, t0 + t:], e["before"][n][:, :, t0 + t:]), f"{role}.{n}: rows past the chunk"
        win = e["wbuf"][:, :, ws + t:ws + t + r]
        assert np.array_equal(win, ke._np(e["want"]["window"])), f"{mk}/{mv} {role}: the window after the step"
        outside = np.ones(e["wbuf"].shape[2], bool)
        outside[ws + r:ws + r + t] = False
        assert np.array_equal(e["wbuf"][:, :, outside], e["wbefore"][:, :, outside]), \
            f"{mk}/{mv} {role}: window buffer rows other than the chunk's were written"


G, R = KW["kivi"]["group_size"], 5


@pytest.mark.parametrize("mk,mv,xt", KIVI_PAIRS)
@pytest.mark.parametrize("apart", [True, False], ids=["apart", "serial"])
@pytest.mark.parametrize("r,t0,w,ws", [(R, 16, R + G - 1, 2), (R, 0, R + G - 1, 0), (R, 16, 7, 3), (R, 32, R, 0),
                                       (R, 32, R + G - 2, 1), (0, 16, G - 1, 2), (0, 32, 0, 1), (0, 0, 5, 0)])
def test_kivi_append_flushes_a_group_or_only_copies(lib, mk, mv, xt, apart, r, t0, w, ws):
    """KIVI with an exact window of R (its window holds R .. R + G - 1 tokens): a decode step's token is copied into
    the window, and where the window reaches R + G the launch also encodes its oldest G tokens (keys: one row of
    per-channel scale and zero and G rows of codes; values: G per-token rows) at records row t0 (group row t0 / G),
    from kf (nq = G); otherwise it encodes nothing (nq = 0). The records and the window after the step are one-shot
    encode's of all t0 + w + 1 tokens, bit for bit, and no other row of any buffer is written. With R = 0 the flush's
    last token is the chunk's own (own = 1): kf's last row is the chunk's row of the window buffer, not yet written,
    so the launch reads it from the chunk; kw is that row (the window after the step is empty)."""
    rng = np.random.default_rng(t0 * 7 + w + ws + r)
    flush = w + 1 == r + G
    nq = G if flush else 0
    own = max(nq - w, 0)
    kp = spec.Params(mk, role="k", window=r, seed=3, layer=2, head_offset=4, **KW[mk]).resolved()
    vp = spec.Params(mv, role="v", window=r, seed=3, layer=2, head_offset=4, **KW[mv]).resolved()
    total = t0 + w + 1
    case, views = {}, {}
    for role, p in (("k", kp), ("v", vp)):
        x = _x(rng, (2, 3, total, D), xt)
        want = ops.method_module(p.method).encode(x, p)
        assert want["window"].shape[2] == w + 1 - nq, "the case's window after the step"
        grouped = {n for n in want if n != "window" and role == "k" and n != "codes"}
        bufs, before = {}, {}
        for n, a in want.items():
            if n == "window":
                continue
            wnp = ke._np(a)
            per = G if n in grouped else 1
            done, cap = t0 // per, (t0 + G) // per + 2
            buf = rng.integers(0, 2 ** 10, (*wnp.shape[:2], cap, *wnp.shape[3:])).astype(wnp.dtype)
            if done:
                buf[:, :, :done] = wnp[:, :, :done]
            bufs[n], before[n] = buf, buf.copy()
        xn = ke._np(x)
        wbuf = rng.standard_normal((2, 3, ws + w + 1 + 4, D)).astype(xn.dtype)
        wbuf[:, :, ws:ws + w] = xn[:, :, t0:t0 + w]
        views[f"{role}f"] = wbuf[:, :, ws:ws + G] if flush else wbuf[:, :, ws:ws + 1]
        views[f"{role}w"] = wbuf[:, :, ws + nq - own:ws + w + 1]
        case[role] = dict(p=p, chunk=x[:, :, total - 1:], bufs=bufs, before=before, want=want, wbuf=wbuf,
                          wbefore=wbuf.copy(), grouped=grouped)
    k, v = case["k"], case["v"]
    flags = _run(lib, kp, k["chunk"], k["bufs"], vp, v["chunk"], v["bufs"], t0, apart=apart, windows=views, nq=nq,
                 own=own)
    assert not flags.any(), f"kivi append: fault flags on good input: {flags.tolist()}"
    for role in ("k", "v"):
        e = case[role]
        for n, buf in e["bufs"].items():
            per = G if n in e["grouped"] else 1
            end = (t0 + nq) // per
            w_ = ke._np(e["want"][n])
            assert w_.shape[2] == end, (n, w_.shape)
            diff = np.count_nonzero(buf[:, :, :end] != w_)
            assert diff == 0, f"{role}.{n}: {diff} of {w_.size} elements differ from one-shot encode (flush {flush})"
            assert np.array_equal(buf[:, :, end:], e["before"][n][:, :, end:]), f"{role}.{n}: rows past the records"
        win = e["wbuf"][:, :, ws + nq:ws + w + 1]
        assert np.array_equal(win, ke._np(e["want"]["window"])), f"{role}: the window after the step"
        assert np.array_equal(e["wbuf"][:, :, ws + w], ke._np(e["chunk"])[:, :, 0]), f"{role}: the chunk's row"
        outside = np.ones(e["wbuf"].shape[2], bool)
        outside[ws + w] = False
        assert np.array_equal(e["wbuf"][:, :, outside], e["wbefore"][:, :, outside]), \
            f"{role}: window buffer rows other than the chunk's were written"


def test_kivi_append_fault_slots(lib):
    """KIVI flush: a value chunk's NaN sets [values][*][NaN/Inf] only; keys leaving the window whose group's scale
    overflows float16 set [keys][*][rule] only (the rule is checked on the tokens encoded; bfloat16 input)."""
    rng = np.random.default_rng(5)
    kp = spec.Params("kivi", role="k", window=R, **KW["kivi"]).resolved()
    vp = spec.Params("kivi", role="v", window=R, **KW["kivi"]).resolved()
    views, bufs = {}, {}
    for role, p in (("k", kp), ("v", vp)):
        wbuf = ke._np(_x(rng, (1, 2, R + G + 2, D), "bfloat16"))
        views[f"{role}f"], views[f"{role}w"] = wbuf[:, :, :G], wbuf[:, :, G:G + R]
        bufs[role] = {n: np.zeros((1, 2, 4 if role == "k" and n != "codes" else 40, *a.shape[3:]), a.dtype)
                      for n, a in ((n, ke._np(a)) for n, a in ops.method_module("kivi").encode(
                          mx.zeros((1, 2, G + R, D)), p).items()) if n != "window"}
    chunk = _x(rng, (1, 2, 1, D), "bfloat16")
    bad = np.array(chunk.astype(mx.float32))
    bad[0, 1, 0, 3] = np.nan
    flags = _run(lib, kp, chunk, bufs["k"], vp, mx.array(bad).astype(mx.bfloat16), bufs["v"], 0, windows=views, nq=G)
    assert flags[1, :, 0].any() and not flags[0].any() and not flags[1, :, 1].any(), flags.tolist()
    big = ke._np(mx.array([-1e6, 1e6]).astype(mx.bfloat16))      # a scale of 2e6 / 3: past float16's range
    views["kf"][:, :, 0, 0], views["kf"][:, :, 1, 0] = big[0], big[1]
    flags = _run(lib, kp, chunk, bufs["k"], vp, chunk, bufs["v"], 0, windows=views, nq=G)
    assert flags[0, :, 1].any() and not flags[0, :, 0].any() and not flags[1].any(), flags.tolist()


def test_append_with_windows_fault_slots(lib):
    """With windows: NaN in the values' chunk sets [values][*][NaN/Inf] only (the chunk is what is checked), and a
    norm overflowing binary32 in the keys' oldest window token (the one encoded) sets [keys][*][rule] only."""
    rng = np.random.default_rng(2)
    c = _window_case(rng, "turboquant_prod", "rabitq", "float32", 5, 1, 3, 1)
    k, v = c["k"], c["v"]
    bad = np.array(v["chunk"])
    bad[0, 2, 0, 7] = np.nan
    flags = _run(lib, k["p"], k["chunk"], k["bufs"], v["p"], mx.array(bad), v["bufs"], 5,
                 windows={**k["views"], **v["views"]})
    assert flags[1, :, 0].any() and not flags[0].any() and not flags[1, :, 1].any(), flags.tolist()
    k["views"]["kf"][:] *= np.float32(1e30)
    flags = _run(lib, k["p"], k["chunk"], k["bufs"], v["p"], v["chunk"], v["bufs"], 5,
                 windows={**k["views"], **v["views"]})
    assert flags[0, :, 1].any() and not flags[0, :, 0].any() and not flags[1].any(), flags.tolist()


def metal_append_source(mk: str, mv: str, xt: str, apart: bool = False) -> str:
    """The kernel as MLX's metal_kernel writes it (see tests/test_kernels_source.metal_kernel_source): arrays
    of < 8 elements (base, after) in `constant` memory, the attributes the source names."""
    import test_kernels_source as tks
    header, src = fused.assemble("metal", mk, mv, apart)
    tk, tv = tks.METAL_TYPES[_ts(mk, xt)], tks.METAL_TYPES[_ts(mv, xt)]
    ins = []
    for n in fused.inputs(mk, mv):
        loc = "constant" if n in ("base", "after") else "device"
        ty = {"base": "int32_t", "after": "bool"}.get(n) or {"x": tks.METAL_TYPES[xt], "const": "uint32_t",
                                                               "codes1": "uint32_t", "codes2": "uint32_t"}.get(
            n[1:], tk if n[0] == "k" else tv)
        ins.append((n, ty, loc))
    params = tks.metal_params(ins, [("flags", "bool")], src)
    name = f"custom_kernel_vq_append_{mk}_{mv}_{xt}" + ("_apart" if apart else "")
    codes = fused.code_template(_params(mk), _params(mv), ROWS)
    targs = f"<{source.METHOD_IDS[mk]}, {source.METHOD_IDS[mv]}, {D}, {tk}, {tv}, " + ", ".join(str(v) for _, v in codes) + ">"
    tparams = ", ".join(f"int {n}" for n, _ in codes)
    return (f"template <int KM, int VM, int D, typename KTS, typename VTS, {tparams}>\n[[kernel]] void {name}(\n"
            + ",\n".join(params) + f") {{\n{src}\n}}\n"
            + f"template [[host_name(\"{name}\")]] [[kernel]] decltype({name}{targs}) {name}{targs};\n")


def test_metal_append_compiles_against_shim(tmp_path):
    """Every pair, in both role layouts (roles_apart off and on)."""
    import test_kernels_source as tks
    text = source.METAL_HEADER + "".join(metal_append_source(mk, mv, xt, apart)
                                         + "#undef VQ_OROW\n#define VQ_OROW(bh, ne, i) ((bh) * (ne) + (i))\n"
                                         for apart in (False, True) for mk, mv, xt in PAIRS)
    r = tks._gxx_metal(text, tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_append_compiles(tmp_path):
    """Each pair's kernel as mx.fast.cuda_kernel wraps it (tests/test_attention_kernels_source._kernel), sm_90, in both
    role layouts (roles_apart off and on)."""
    import test_attention_kernels_source as tas
    cu = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
    body, header = "", ""
    for i, (mk, mv, xt, apart) in enumerate((*pair, apart) for apart in (False, True) for pair in PAIRS):
        header, text = fused.assemble("cuda", mk, mv, apart)
        tk, tv = cu[_ts(mk, xt)], cu[_ts(mv, xt)]
        types = {n: _ctype(n, xt, tk, tv).replace("_Float16", "__half").replace("vq_bf16", "__nv_bfloat16")
                 for n in fused.inputs(mk, mv)}
        types["flags"] = "bool"
        body += tas._kernel(f"append_{i}", text, fused.inputs(mk, mv), fused.OUTPUTS, types,
                            [("KM", source.METHOD_IDS[mk]), ("VM", source.METHOD_IDS[mv]), ("D", 128), ("KTS", tk),
                             ("VTS", tv), *fused.code_template(_params(mk), _params(mv), ROWS)])
        body += "#undef VQ_OROW\n#define VQ_OROW(bh, ne, i) ((bh) * (ne) + (i))\n"
    text = (CUDA_UNIT_PRELUDE + header + "namespace mlx::core::cu {\n" + body + "}\n")
    f = tmp_path / "append.cu"
    f.write_text(text)
    r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", "-cubin", str(f), "-o",
                        str(tmp_path / "append.cubin")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    assert " 0 bytes spill stores" in r.stderr and "bytes spill stores" in r.stderr


@pytest.mark.parametrize("mk,mv,xt,apart,win", MIXED_VARIANTS, ids=[f"{v[0]}-{v[1]}-{v[2]}-{'apart' if v[3] else 'serial'}"
                                                                   for v in MIXED_VARIANTS])
@pytest.mark.parametrize("r,fill", [(128, "flush"), (128, "copy"), (32, "flush"), (32, "copy")])
def test_mixed_append_moves_one_roles_window(lib, mk, mv, xt, apart, win, r, fill):
    """fused.MIXED: one launch for keys and values of different methods and windows, each role at its own first row
    (base, vbase): keys turboquant 3-bit with R = 0 encode the chunk itself while KIVI 2-bit values (R = 128 or 32,
    groups of 32) copy it into their window and encode their window's oldest group at a flush or nothing; keys with
    an exact window R encode their window's oldest token beside rabitq values without one. Records and windows after
    the step are one-shot encode's of the whole sequence, bit for bit; no other row of any buffer is written. (Both
    roles windowed: the keys' R-token window beside the values' KIVI window, each at its own count.)"""
    rng = np.random.default_rng(r + len(fill) + len(mk + mv + xt) + apart)
    kkw, vkw = MIXED_KW[(mk, mv)]
    windowed = [w for w in win]
    kp = spec.Params(mk, role="k", window=r if win[0] else 0, seed=3, layer=2, head_offset=4, **kkw).resolved()
    vp = spec.Params(mv, role="v", window=r if win[1] else 0, seed=3, layer=2, head_offset=4, **vkw).resolved()
    g = vkw.get("group_size", 0) if mv == "kivi" else 0
    # the values' window before the step: R + G - 1 (the step flushes a group) or R + 5 (it only copies)
    w = (r + g - 1 if fill == "flush" else r + 5) if g else r
    total = 2 * 32 + w + 1                     # the sequence after the step (two groups before the window)
    case, views, nqs, bases = {}, {}, [], []
    for role, p, has_w in (("k", kp, windowed[0]), ("v", vp, windowed[1])):
        x = _x(rng, (1, 2, total, D), xt)
        want = ops.method_module(p.method).encode(x, p)
        gr = p.group_size if p.method == "kivi" else 0
        flush = bool(gr) and fill == "flush"
        nq = (gr if flush else 0) if gr else 1
        wlen = (w if gr else r) if has_w else 0       # the window before the step
        t0 = total - 1 - wlen                         # the encoded tokens before it
        assert want["window"].shape[2] == wlen + 1 - nq, "the case's window after the step"
        grouped = {n for n in want if n != "window" and gr and role == "k" and n != "codes"}
        bufs, before = {}, {}
        for n, a in want.items():
            if n == "window":
                continue
            wnp = ke._np(a)
            per = gr if n in grouped else 1
            done, cap = t0 // per, (t0 + max(gr, 1)) // per + 2
            buf = rng.integers(0, 2 ** 10, (*wnp.shape[:2], cap, *wnp.shape[3:])).astype(wnp.dtype)
            buf[:, :, :done] = wnp[:, :, :done]
            bufs[n], before[n] = buf, buf.copy()
        xn = ke._np(x)
        ws = 3
        wbuf = rng.standard_normal((1, 2, ws + wlen + 1 + 4, D)).astype(xn.dtype)
        if has_w:
            wbuf[:, :, ws:ws + wlen] = xn[:, :, t0:t0 + wlen]
            views[f"{role}f"] = wbuf[:, :, ws:ws + max(nq, 1)]
            views[f"{role}w"] = wbuf[:, :, ws + nq:ws + wlen + 1]
        case[role] = dict(chunk=x[:, :, total - 1:], bufs=bufs, before=before, want=want, wbuf=wbuf, ws=ws,
                          wbefore=wbuf.copy(), grouped=grouped, t0=t0, nq=nq, wlen=wlen, has_w=has_w, per=gr)
        nqs.append(nq)
        bases.append(t0)
    k, v = case["k"], case["v"]
    flags = _run(lib, kp, k["chunk"], k["bufs"], vp, v["chunk"], v["bufs"], bases[0], apart=apart, windows=views,
                 nq=tuple(nqs), own=(0, 0), win=win, vbase=bases[1])
    assert not flags.any(), f"mixed append: fault flags on good input: {flags.tolist()}"
    for role in ("k", "v"):
        e = case[role]
        for n, buf in e["bufs"].items():
            per = e["per"] if n in e["grouped"] else 1
            end = (e["t0"] + e["nq"]) // per
            w_ = ke._np(e["want"][n])
            assert w_.shape[2] == end, (role, n, w_.shape, end)
            diff = np.count_nonzero(buf[:, :, :end] != w_)
            assert diff == 0, f"{role}.{n}: {diff} of {w_.size} elements differ from one-shot encode ({fill})"
            assert np.array_equal(buf[:, :, end:], e["before"][n][:, :, end:]), f"{role}.{n}: rows past the records"
        ws = e["ws"]
        if e["has_w"]:
            win_after = e["wbuf"][:, :, ws + e["nq"]:ws + e["wlen"] + 1]
            assert np.array_equal(win_after, ke._np(e["want"]["window"])), f"{role}: the window after the step"
        outside = np.ones(e["wbuf"].shape[2], bool)
        if e["has_w"]:
            outside[ws + e["wlen"]] = False
        assert np.array_equal(e["wbuf"][:, :, outside], e["wbefore"][:, :, outside]), \
            f"{role}: window buffer rows other than the chunk's were written"
