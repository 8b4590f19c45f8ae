"""accelerated.kernels.append's kernel text on the CPU (the emulator of tests/_kernel_emulator.py): both roles'
new tokens encoded by source.py's body and stored in place at rows base..base+t-1 of buffers with spare
capacity, bit for bit the fields one-shot encode stores (accelerated.ops), rows outside untouched, and each
fault in its own slot of the token ([role][group][NaN/Inf, rule]). The GPU side (the launch, MLX's
signature) runs in tests/test_kernels_gpu.py on a GPU."""
from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile

import mlx.core as mx
import numpy as np
import pytest

import spec
from accelerated import ops
from accelerated.kernels import append as fused
from accelerated.kernels import methods as km
from accelerated.kernels import source

import _kernel_emulator as ke   # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

D = 64
# (key method, value method, x type, key TS, value TS): every method of the fused path in each role
PAIRS = [("turboquant", "turboquant", "float16"), ("turboquant_rvq", "turboquant_prod", "bfloat16"),
         ("rabitq", "mlx_affine", "float16"), ("turboquant_prod", "rabitq", "float32"),
         ("mlx_affine", "turboquant_rvq", "float32")]
KW = {"turboquant": dict(bits=3), "turboquant_rvq": dict(bits=2, bits2=3), "turboquant_prod": dict(bits=4),
      "rabitq": dict(), "mlx_affine": dict(bits=4, group_size=32)}
_C = {"float32": "float", "float16": "_Float16", "bfloat16": "vq_bf16"}


def _ts(method: str, xt: str) -> str:
    return xt if method == "mlx_affine" else "float32"


def _role_params(r: str) -> str:
    t = "KTS" if r == "k" else "VTS"
    return (f"const XT* {r}x, Shape {r}x_shape, Strides {r}x_strides, const uint32_t* {r}sig, const uint32_t* {r}tau, "
            f"const float* {r}f_c1, const float* {r}f_b1, const float* {r}f_c2, const float* {r}f_b2, "
            f"const float* {r}f_k, const int32_t* {r}meta, const uint32_t* {r}codes1, Shape {r}codes1_shape, "
            f"const uint32_t* {r}codes2, const {t}* {r}f_s1, const {t}* {r}f_s2")


def _role_args(i0: int, sh: int, xt: str, t: str) -> str:
    types = [xt, "uint32_t", "uint32_t", "float", "float", "float", "float", "float", "int32_t", "uint32_t",
             "uint32_t", t, t]
    out = []
    for j, ty in enumerate(types):
        out.append(f"(const {ty}*)p[{i0 + j}]")
        if j == 0:
            out += [f"shape_of(sh + {sh * 4})", f"strides_of(st + {sh * 4})"]
        if j == 9:
            out.append(f"shape_of(sh + {(sh + 1) * 4})")
    return ", ".join(out)


def _source() -> str:
    head = (ke.HARNESS.replace("@ENCODE@", ke.PRELUDE + source.ENCODE_BODY)
            .replace("@DECODE@", ke.PRELUDE + source.DECODE_BODY)
            .replace("@ENC_DISPATCH@", "").replace("@DEC_DISPATCH@", ""))
    fn = ("#define VQ_ALIAS(n, s) const auto& n = s;\n#define VQ_MUT(type, p) const_cast<type*>(p)\n"
          "template <int KM, int VM, int D, typename XT, typename KTS, typename VTS>\n"
          f"static void app_thread(const int32_t* base, const bool* after, {_role_params('k')}, "
          f"{_role_params('v')}, bool* flags) {{\n" + ke.PRELUDE + fused.body() + "}\n")
    calls = []
    for mk, mv, xt in PAIRS:
        tk, tv = _C[_ts(mk, xt)], _C[_ts(mv, xt)]
        ids = (source.METHOD_IDS[mk], source.METHOD_IDS[mv], ke._XT_ID[xt])
        calls.append(
            f"  if (km == {ids[0]} && vm == {ids[1]} && xt == {ids[2]}) {{ run_grid(groups, warps, [&] {{ "
            f"app_thread<{ids[0]}, {ids[1]}, {D}, {_C[xt]}, {tk}, {tv}>((const int32_t*)p[0], (const bool*)p[1], "
            f"{_role_args(2, 0, _C[xt], tk)}, {_role_args(15, 2, _C[xt], tv)}, (bool*)p[28]); }}); return 0; }}")
    entry = ("extern \"C\" int vq_append(int km, int vm, int xt, int groups, int warps, void** p, const int64_t* sh, "
             "const int64_t* st) {\n" + "\n".join(calls) + "\n  return 1;\n}\n")
    return head + fn + entry


@pytest.fixture(scope="module")
def lib():
    text = _source()
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = pathlib.Path(os.environ.get("VELOXQUANT_KEMU_DIR", tempfile.gettempdir()))
    so = folder / f"veloxquant-append-{key}.so"
    if not so.exists():
        cpp = folder / f"veloxquant-append-{key}.cpp"
        cpp.write_text(text)
        tmp = folder / f"veloxquant-append-{key}.{os.getpid()}.so"
        r = subprocess.run(["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC",
                            "-pthread", str(cpp), "-o", str(tmp)], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-6000:]
        os.replace(tmp, so)
    return ctypes.CDLL(str(so))


def _x(rng, shape, xt):
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(getattr(mx, xt))


def _run(lib, kp, xk, kbufs, vp, xv, vbufs, base, groups=2, warps=2):
    """The emulated launch; buffers (numpy, written in place) by field name; returns the token."""
    ins = [np.array([base], np.int32), np.zeros(1, np.bool_)]
    shapes, strides = [], []
    for p, x, bufs in ((kp, xk, kbufs), (vp, xv, vbufs)):
        xn = ke._np(x)
        role = fused._role(p, x, {n: mx.array(0) for n in bufs})      # the static inputs, as the launch has them
        names = km.FIELDS[p.method]
        outs = [bufs[n] if n else np.zeros(1, np.uint32 if i < 2 else ke._NP[km._side_dtype(p, x.dtype)])
                for i, n in enumerate(names)]
        ins += [xn] + [ke._np(a) for a in role[1:9]] + outs
        shapes += [list(xn.shape), list(outs[0].shape)]
        strides += [[s // xn.itemsize for s in xn.strides], [0, 0, 0, 0]]
    flags = np.zeros((2, groups, 2), np.bool_)
    ins.append(flags)
    ptrs = (ctypes.c_void_p * len(ins))(*[a.ctypes.data for a in ins])
    sh, st = np.array(shapes, np.int64), np.array(strides, np.int64)
    rc = lib.vq_append(source.METHOD_IDS[kp.method], source.METHOD_IDS[vp.method],
                       ke._XT_ID[ke._dtname(xk.dtype)], groups, warps, ptrs, ke._ptr(sh), ke._ptr(st))
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


@pytest.mark.parametrize("mk,mv,xt", PAIRS)
@pytest.mark.parametrize("t0,t", [(5, 1), (9, 4)])
def test_append_stores_one_shot_bytes_in_place(lib, mk, mv, xt, t0, t):
    rng = np.random.default_rng(t0 * 7 + t)
    kp = spec.Params(mk, role="k", window=0, seed=3, layer=2, head_offset=4, **KW[mk]).resolved()
    vp = spec.Params(mv, role="v", window=0, seed=3, layer=2, head_offset=4, **KW[mv]).resolved()
    xk, xv = _x(rng, (2, 3, t0 + t, D), xt), _x(rng, (2, 3, t0 + t, D), xt)
    wk = {n: a for n, a in ops.method_module(mk).encode(xk, kp).items() if n != "window"}
    wv = {n: a for n, a in ops.method_module(mv).encode(xv, vp).items() if n != "window"}
    cap = t0 + t + 3
    kb, k0 = _buffers(rng, wk, t0, cap)
    vb, v0 = _buffers(rng, wv, t0, cap)
    flags = _run(lib, kp, xk[:, :, t0:], kb, vp, xv[:, :, t0:], vb, t0)
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


def metal_append_source(mk: str, mv: str, xt: str) -> str:
    """The kernel as MLX's metal_kernel writes it (see tests/test_kernels_source.metal_kernel_source): arrays
    of < 8 elements in `constant` memory (base, after, the dummies of unused sign vectors and tables)."""
    import test_kernels_source as tks
    header, src = fused.assemble("metal")
    ts = {r: tks.METAL_TYPES[_ts(m, xt)] for r, m in (("k", mk), ("v", mv))}
    small = {"base", "after"} | {f"{r}{n}" for r in "kv" for n in ("tau", "f_c2", "f_b2", "sig", "f_c1", "f_b1")}
    types = {"base": "int32_t", "after": "bool"}
    for r in "kv":
        types.update({f"{r}x": tks.METAL_TYPES[xt], f"{r}sig": "uint32_t", f"{r}tau": "uint32_t", f"{r}meta": "int32_t",
                      f"{r}codes1": "uint32_t", f"{r}codes2": "uint32_t", f"{r}f_s1": ts[r], f"{r}f_s2": ts[r]})
    params, i = [], 0
    for n in fused.INPUTS:
        loc = "constant" if n in small else "device"
        params.append(f"  const {loc} {types.get(n, 'float')}* {n} [[buffer({i})]]")
        i += 1
        for suffix, ty in (("_shape", "int"), ("_strides", "int64_t")):
            if f"{n}{suffix}" in src:
                params.append(f"  const constant {ty}* {n}{suffix} [[buffer({i})]]")
                i += 1
    params.append(f"  device bool* flags [[buffer({i})]]")
    params += [f"  {t} {a} [[{a}]]" for a, t in tks.MLX_METAL_ATTRIBUTES.items() if a in src]
    name = f"custom_kernel_vq_append_{mk}_{mv}_{xt}"
    targs = f"<{source.METHOD_IDS[mk]}, {source.METHOD_IDS[mv]}, {D}, {ts['k']}, {ts['v']}>"
    return (f"template <int KM, int VM, int D, typename KTS, typename VTS>\n[[kernel]] void {name}(\n"
            + ",\n".join(params) + f") {{\n{src}\n}}\n"
            + f"template [[host_name(\"{name}\")]] [[kernel]] decltype({name}{targs}) {name}{targs};\n")


def test_metal_append_compiles_against_shim(tmp_path):
    import test_kernels_source as tks
    text = source.METAL_HEADER + "".join(metal_append_source(mk, mv, xt) for mk, mv, xt in PAIRS)
    r = tks._gxx_metal(text, tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
