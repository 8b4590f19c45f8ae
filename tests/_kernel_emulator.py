"""The kernel bodies of accelerated.kernels.source compiled as C++20 on the CPU, each GPU thread a fiber on the
calling OS thread (tests/_fibers.py: a barrier switches to the next runnable fiber, so a 2-core machine does not
context-switch hundreds of OS threads at every shuffle): warps of 32 lanes whose shuffles, votes and warp syncs go
through a per-warp exchange slot and a warp barrier, threadgroups whose barrier is a VqBarrier over all the
launch's fibers, threadgroup memory as function statics (one threadgroup runs at a time, the launch's threads
running each in turn). Float helpers are plain binary32 operators
compiled with -ffp-contract=off (no FMA); float16 is GCC's _Float16 (RNE conversions), bfloat16 a struct with an
RNE conversion.

Used by tests/test_kernels_emulated.py. `Emulator.encode(x, p, q, check_from, ...)` and `.decode(fields, p,
d)` mirror accelerated.kernels.methods.KernelMethod (same inputs, template constants, output shapes).
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import pathlib
import subprocess
import tempfile

import mlx.core as mx
import numpy as np

from veloxquant import spec
from veloxquant.accelerated.kernels import methods as km
from veloxquant.accelerated.kernels import source
from veloxquant.accelerated import tuning
from _fibers import FIBERS

PRELUDE = """
#define TID vq_tid
#define TOKEN vq_group
#define HEAD 0
#define BATCH 0
#define NTOK vq_ngroups
#define NHEAD 1
#define LANE vq_lane
#define WARP vq_warp
#define NWARPS vq_nwarps
#define GROUP vq_group
#define NGROUPS vq_ngroups
#define SHARED(type, name, n) static type name[n]
#define BARRIER() vq_block_bar->arrive_and_wait()
#define WARP_SYNC() vq_warp_sync()
#define SHFL_XOR(v, m) vq_shfl((v), vq_lane ^ (int)(m))
#define SHFL_DOWN(v, s) vq_shfl((v), vq_lane + (int)(s) < 32 ? vq_lane + (int)(s) : vq_lane)
#define SHFL(v, l) vq_shfl((v), (int)(l))
#define ANY(p) (vq_ballot_impl((p)) != 0u)
#define BALLOT(p) vq_ballot_impl((p))
#define ADD(a, b) vq_add((a), (b))
#define SUB(a, b) vq_sub((a), (b))
#define MUL(a, b) vq_mul((a), (b))
#define DIV(a, b) vq_div((a), (b))
#define SQRT(a) std::sqrt((float)(a))
#define NEG(a) (-(a))
#define ABS(a) std::fabs((float)(a))
#define FLIP(v, m) vq_flip((v), (m))
#define MINF(a, b) std::fmin((float)(a), (float)(b))
#define MAXF(a, b) std::fmax((float)(a), (float)(b))
#define PIN(v) (v)
#define TO_F32(v) static_cast<float>(v)
#define TO_TS(v) vq_to<TS>((v))
#define VQ_OROW(bh, ne, i) ((bh) * (ne) + (i))
// the GPU preludes read these from template constants (B1, ...), the emulator from meta
#define VQ_B1 meta[1]
#define VQ_B2 meta[2]
#define VQ_GS meta[3]
#define VQ_KR meta[4]
"""

HARNESS = r"""
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
""" + FIBERS + r"""

struct vq_bf16 {
  uint16_t u;
  explicit operator float() const { uint32_t w = (uint32_t)u << 16; float f; std::memcpy(&f, &w, 4); return f; }
};
template <typename T> static T vq_to(float f);
template <> float vq_to<float>(float f) { return f; }
template <> _Float16 vq_to<_Float16>(float f) { return (_Float16)f; }
template <> vq_bf16 vq_to<vq_bf16>(float f) {
  uint32_t w; std::memcpy(&w, &f, 4);
  vq_bf16 b;
  if ((w & 0x7fffffffu) > 0x7f800000u) { b.u = (uint16_t)((w >> 16) | 0x40u); return b; }
  w += 0x7fffu + ((w >> 16) & 1u);
  b.u = (uint16_t)(w >> 16);
  return b;
}
using Shape = std::array<int32_t, 10>;
using Strides = std::array<int64_t, 10>;

static int vq_lane, vq_warp, vq_tid, vq_group;     // each thread's (a fiber's: run_grid registers them)
static int vq_ngroups, vq_nwarps;
static VqBarrier* vq_block_bar;
struct VqWarp { VqBarrier* bar; uint32_t slot[32]; };
static VqWarp* vq_warps;

static inline void vq_warp_sync() { vq_warps[vq_warp].bar->arrive_and_wait(); }
template <typename T> static T vq_shfl(T v, int src) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  VqWarp& w = vq_warps[vq_warp];
  uint32_t u; std::memcpy(&u, &v, 4);
  w.slot[vq_lane] = u;
  w.bar->arrive_and_wait();
  uint32_t r = w.slot[src & 31];
  w.bar->arrive_and_wait();
  T o; std::memcpy(&o, &r, 4);
  return o;
}
static uint32_t vq_ballot_impl(bool p) {
  VqWarp& w = vq_warps[vq_warp];
  w.slot[vq_lane] = p ? 1u : 0u;
  w.bar->arrive_and_wait();
  uint32_t m = 0;
  for (int i = 0; i < 32; ++i) m |= w.slot[i] << i;
  w.bar->arrive_and_wait();
  return m;
}
static inline float vq_flip(float v, uint32_t m) { uint32_t u; std::memcpy(&u, &v, 4); u ^= m; std::memcpy(&v, &u, 4); return v; }
static inline float vq_add(float a, float b) { return a + b; }
static inline float vq_sub(float a, float b) { return a - b; }
static inline float vq_mul(float a, float b) { return a * b; }
static inline float vq_div(float a, float b) { return a / b; }

template <int M, int D, typename XT, typename TS>
static void enc_thread(const XT* x, Shape x_shape, Strides x_strides, const uint32_t* sig, const uint32_t* tau,
    const float* f_c1, const float* f_b1, const float* f_c2, const float* f_b2, const float* f_k,
    const int32_t* meta, uint32_t* codes1, uint32_t* codes2, TS* f_s1, TS* f_s2, bool* fault) {
@ENCODE@
}

template <int M, int D, typename TS>
static void dec_thread(const uint32_t* codes1, Shape codes1_shape, const uint32_t* codes2, const TS* f_s1,
    const TS* f_s2, const uint32_t* sig, const uint32_t* tau, const float* f_c1, const float* f_c2,
    const float* f_k, const int32_t* meta, float* f_out) {
@DECODE@
}

// the groups one after the other; the warps * 32 threads (fibers made once per launch, not per group) run every
// group in turn, a group starting once every thread is done with the one before (the `next` barrier)
template <typename F>
static void run_grid(int groups, int warps, F f) {
  vq_ngroups = groups; vq_nwarps = warps;
  vq_fiber_vars({&vq_tid, &vq_lane, &vq_warp, &vq_group});
  VqBarrier block(0, warps * 32), next(0, warps * 32);
  vq_block_bar = &block;
  std::vector<VqBarrier> bars;
  for (int w = 0; w < warps; ++w) bars.emplace_back(32 * w, 32);
  std::vector<VqWarp> ws(warps);
  for (int w = 0; w < warps; ++w) ws[w].bar = &bars[w];
  vq_warps = ws.data();
  auto thread = [&](int t) {
    vq_tid = t; vq_lane = t & 31; vq_warp = t >> 5;
    for (int g = 0; g < groups; ++g) { vq_group = g; f(); next.arrive_and_wait(); }
  };
  vq_fibers_run(warps * 32, thread);
}

static Shape shape_of(const int64_t* s) { Shape r{}; for (int i = 0; i < 4; ++i) r[i] = (int32_t)s[i]; return r; }
static Strides strides_of(const int64_t* s) { Strides r{}; for (int i = 0; i < 4; ++i) r[i] = s[i]; return r; }

template <int M, int D, typename XT, typename TS>
static void enc(int groups, int warps, const void* x, const int64_t* sh, const int64_t* st, const void* sig,
    const void* tau, const void* c1, const void* b1, const void* c2, const void* b2, const void* k,
    const void* meta, void* o1, void* o2, void* s1, void* s2, void* flt) {
  Shape shape = shape_of(sh); Strides strides = strides_of(st);
  run_grid(groups, warps, [&] {
    enc_thread<M, D, XT, TS>((const XT*)x, shape, strides, (const uint32_t*)sig, (const uint32_t*)tau,
        (const float*)c1, (const float*)b1, (const float*)c2, (const float*)b2, (const float*)k,
        (const int32_t*)meta, (uint32_t*)o1, (uint32_t*)o2, (TS*)s1, (TS*)s2, (bool*)flt);
  });
}

template <int M, int D, typename TS>
static void dec(int groups, int warps, const void* c1w, const int64_t* sh, const void* c2w, const void* s1,
    const void* s2, const void* sig, const void* tau, const void* c1, const void* c2, const void* k,
    const void* meta, void* out) {
  Shape shape = shape_of(sh);
  run_grid(groups, warps, [&] {
    dec_thread<M, D, TS>((const uint32_t*)c1w, shape, (const uint32_t*)c2w, (const TS*)s1, (const TS*)s2,
        (const uint32_t*)sig, (const uint32_t*)tau, (const float*)c1, (const float*)c2, (const float*)k,
        (const int32_t*)meta, (float*)out);
  });
}

extern "C" int vq_encode(int m, int d, int xt, int ts, int groups, int warps, const void* x,
    const int64_t* sh, const int64_t* st, const void* sig, const void* tau, const void* c1, const void* b1,
    const void* c2, const void* b2, const void* k, const void* meta, void* o1, void* o2, void* s1, void* s2,
    void* flt) {
@ENC_DISPATCH@
  return 1;
}

extern "C" int vq_decode(int m, int d, int ts, int groups, int warps, const void* c1w, const int64_t* sh,
    const void* c2w, const void* s1, const void* s2, const void* sig, const void* tau, const void* c1,
    const void* c2, const void* k, const void* meta, void* out) {
@DEC_DISPATCH@
  return 1;
}
"""

# head dims instantiated (VELOXQUANT_KEMU_DIMS=16,32,...,1024 for a run that covers every spec head dim)
HEAD_DIMS = tuple(int(v) for v in os.environ.get("VELOXQUANT_KEMU_DIMS", "16,32,64,128").split(","))
XTYPES = {"float32": "float", "float16": "_Float16", "bfloat16": "vq_bf16"}
_XT_ID = {n: i for i, n in enumerate(XTYPES)}


def _combos(dims=None):
    """(M, D, x type, TS type) of every encode instantiation and (M, D, TS) of every decode one."""
    enc, dec = [], []
    for m in range(6):
        for d in (HEAD_DIMS if dims is None else dims):
            if m == 5 and not any(d % g == 0 for g in spec.method_info("mlx_affine")["group_sizes"]):
                continue   # mlx_affine: G must divide d
            for xt in XTYPES:
                # mlx_affine: TS is the declared input dtype, which a stream's float32 upcast x differs from
                for ts in (("float32",) if m <= 3 else ("float16",) if m == 4 else tuple(XTYPES)):
                    enc.append((m, d, xt, ts))
            for ts in (("float32",) if m <= 3 else ("float16",) if m == 4 else tuple(XTYPES)):
                dec.append((m, d, ts))
    return enc, dec


def cpp_source(dims=None, bodies=None) -> str:
    """The emulator's C++ text for head dims `dims` (default HEAD_DIMS); `bodies` {"encode": text, "decode":
    text} replaces source.BODIES (a deliberately broken body, to show that a test catches it)."""
    bodies = {**source.BODIES, **(bodies or {})}
    enc, dec = _combos(dims)
    ed = "\n".join(f"  if (m == {m} && d == {d} && xt == {_XT_ID[xt]} && ts == {_XT_ID[ts]}) {{ "
                   f"enc<{m}, {d}, {XTYPES[xt]}, {XTYPES[ts]}>(groups, warps, x, sh, st, sig, tau, c1, b1, c2, b2, "
                   f"k, meta, o1, o2, s1, s2, flt); return 0; }}" for m, d, xt, ts in enc)
    dd = "\n".join(f"  if (m == {m} && d == {d} && ts == {_XT_ID[ts]}) {{ dec<{m}, {d}, {XTYPES[ts]}>(groups, "
                   f"warps, c1w, sh, c2w, s1, s2, sig, tau, c1, c2, k, meta, out); return 0; }}" for m, d, ts in dec)
    return (HARNESS.replace("@ENCODE@", PRELUDE + bodies["encode"])
            .replace("@DECODE@", PRELUDE + bodies["decode"])
            .replace("@ENC_DISPATCH@", ed).replace("@DEC_DISPATCH@", dd))


EXACT_FLAGS = ("-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math")


def compile_library(text: str, prefix: str = "veloxquant-kemu", folder: pathlib.Path | None = None,
                    flags: tuple[str, ...] = EXACT_FLAGS) -> ctypes.CDLL:
    """Compile C++ emulator text (or reuse the library, keyed by the hash of the text and the flags) with `flags`
    (default: the exact-arithmetic ones, no FMA contraction, no fast math). Safe for processes sharing the folder (pytest -n):
    one compiles a text while the others wait on its lock file, and files appear only whole (os.replace)."""
    key = hashlib.sha256("\0".join((text, *flags)).encode()).hexdigest()[:16]     # (a flag changes the library)
    folder = folder or pathlib.Path(os.environ.get("VELOXQUANT_KEMU_DIR", tempfile.gettempdir()))
    so = folder / f"{prefix}-{key}.so"
    if not so.exists():
        with open(folder / f"{prefix}-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not so.exists():
                tmp = folder / f"{prefix}-{key}.{os.getpid()}"
                cpp = tmp.with_suffix(tmp.suffix + ".cpp")
                cpp.write_text(text)
                r = subprocess.run(["g++", *flags, "-shared", "-fPIC", "-pthread", str(cpp), "-o", str(tmp)],
                                   capture_output=True, text=True, timeout=900)
                if r.returncode != 0:
                    raise RuntimeError(r.stderr[-6000:])
                os.replace(cpp, folder / f"{prefix}-{key}.cpp")
                os.replace(tmp, so)
    return ctypes.CDLL(str(so))


def build(folder: pathlib.Path | None = None, dims=None, bodies=None) -> ctypes.CDLL:
    """Compile (or reuse, keyed by the source's hash) the emulator library (cpp_source's dims, bodies)."""
    return compile_library(cpp_source(dims, bodies), folder=folder)


def _np(a: mx.array) -> np.ndarray:
    if a.dtype == mx.bfloat16:
        return np.ascontiguousarray(np.array(a.view(mx.uint16)))
    return np.ascontiguousarray(np.array(a))


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


_NP = {mx.float32: np.float32, mx.float16: np.float16, mx.bfloat16: np.uint16, mx.uint32: np.uint32,
       mx.bool_: np.bool_}


def _dtname(dt) -> str:
    return {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}[dt]


class Emulator:
    def __init__(self, lib: ctypes.CDLL, warps: int | None = 2, groups: int | None = 2):
        """warps/groups: the launch (None: methods.launch_shape's, as on a GPU)."""
        self.lib, self.warps, self.groups = lib, warps, groups

    def _launch(self, rows: int, d: int) -> tuple[int, int]:
        if self.warps is None:
            _, tg, groups = km.launch_shape(rows, d)
            return groups, tg[0] // 32
        return self.groups, self.warps

    def encode(self, x: np.ndarray | mx.array, p: spec.Params, q: int, check_from: int | None = None,
               dtype=None) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The encode body over x (B, H, T, d) of any dtype/strides: (fields as numpy, fault (groups, 2))."""
        xm = x if isinstance(x, mx.array) else mx.array(x)
        b, h, t, d = xm.shape
        xn = np.array(xm.view(mx.uint16)) if xm.dtype == mx.bfloat16 else np.array(xm)
        if isinstance(x, np.ndarray) and x.dtype == np.float32:
            xn = x                                            # keep a strided numpy view as it is
        lo = t if check_from is None else check_from
        keys = int(p.method == "kivi" and p.role == "k")
        g = p.group_size or 1
        ne = q // g if keys else q
        rows = b * h * (ne + t - max(q, lo))
        groups, warps = self._launch(max(rows, 1), d)
        mk = km.method(p.method)
        ts = km._side_dtype(p, xm.dtype if dtype is None else dtype)
        shapes = km._field_shapes(p, b, h, q, d)
        outs = [np.zeros(s, np.uint32) for s in shapes[:2]] + [np.zeros(s, _NP[ts]) for s in shapes[2:]]
        fault = np.zeros((groups, 2), np.bool_)
        bits1, bits2 = km._code_bits(p)
        sig, tau = (_np(a) for a in km._signs(p, h, d))
        c1, b1, c2, b2 = (_np(a) for a in km._tables(p, d))
        levels = (1 << p.bits) - 1 if p.method in ("kivi", "mlx_affine") else 0
        k = _np(km._consts(d, levels))
        meta = _np(km._meta(bits1, bits2, g, keys, q, lo))
        sh = np.array(xn.shape, np.int64)
        st = np.array([s // xn.itemsize for s in xn.strides], np.int64)
        rc = self.lib.vq_encode(mk.method_id, d, _XT_ID[_dtname(xm.dtype)], _XT_ID[_dtname(ts)], groups, warps,
                                *map(_ptr, (xn, sh, st, sig, tau, c1, b1, c2, b2, k, meta, *outs, fault)))
        assert rc == 0, f"no emulator instantiation for {p.method} d={d} {xm.dtype} TS={ts}"
        names = km.FIELDS[p.method]
        fields = {n: a for n, a in zip(names, outs) if n}
        if ts == mx.bfloat16:
            fields = {n: (a if i < 2 else a) for i, (n, a) in enumerate(fields.items())}
        return fields, fault

    def decode(self, fields: dict[str, np.ndarray | mx.array], p: spec.Params, d: int) -> np.ndarray:
        names = km.FIELDS[p.method]
        f = {n: (v if isinstance(v, mx.array) else mx.array(v)) for n, v in fields.items()}
        codes = _np(f[names[0]])
        b, h, q, _ = codes.shape
        groups, warps = self._launch(b * h * q, d)
        bits1, bits2 = km._code_bits(p)
        sig, tau = (_np(a) for a in km._signs(p, h, d))
        c1, _, c2, _ = (_np(a) for a in km._tables(p, d))
        s1m = f[names[2]]
        ts = s1m.dtype
        s1 = _np(s1m)
        codes2 = _np(f[names[1]]) if names[1] else np.zeros(1, np.uint32)
        s2 = _np(f[names[3]]) if names[3] else np.zeros(1, s1.dtype)
        keys = int(p.method == "kivi" and p.role == "k")
        levels = (1 << p.bits) - 1 if p.method in ("kivi", "mlx_affine") else 0
        k = _np(km._consts(d, levels))
        meta = _np(km._meta(bits1, bits2, p.group_size or 1, keys))
        out = np.zeros((b, h, q, d), np.float32)
        sh = np.array(codes.shape, np.int64)
        rc = self.lib.vq_decode(km.method(p.method).method_id, d, _XT_ID[_dtname(ts)], groups, warps,
                                *map(_ptr, (codes, sh, codes2, s1, s2, sig, tau, c1, c2, k, meta, out)))
        assert rc == 0, f"no emulator instantiation for {p.method} d={d} TS={ts}"
        return out


# ---- the emulator as a stand-in for mx.fast.cuda_kernel (tests of accelerated.kernels' Python side) ------
_MX_NP = {mx.float32: np.float32, mx.float16: np.float16, mx.bfloat16: np.uint16, mx.uint32: np.uint32,
          mx.bool_: np.bool_}


def _to_np(a: mx.array) -> np.ndarray:
    return _np(a)


def _from_np(a: np.ndarray, dt) -> mx.array:
    return mx.array(a).view(mx.bfloat16) if dt == mx.bfloat16 else mx.array(a)


def fake_kernel(lib: ctypes.CDLL, kind: str):
    """A callable with mx.fast.cuda_kernel's kernel signature that runs the body in the emulator."""
    def call(inputs, template, grid, threadgroup, output_shapes, output_dtypes, init_value=None, verbose=False,
             stream=None):
        assert init_value is None, "the kernels never ask MLX to fill outputs"
        t = dict(template)
        m, d, ts = t["M"], t["D"], t["TS"]
        groups, warps = grid[0] // threadgroup[0], threadgroup[0] // 32
        assert grid[0] % threadgroup[0] == 0 and threadgroup[0] % 32 == 0 and 1 <= warps <= tuning.current().max_warps
        assert warps * 2 * d <= source.SMEM_CODES
        outs = [np.zeros(s, _MX_NP[dt]) for s, dt in zip(output_shapes, output_dtypes)]
        ins = [_to_np(a) for a in inputs]
        if kind == "encode":
            x = ins[0]
            sh = np.array(x.shape, np.int64)
            st = np.array([s // x.itemsize for s in x.strides], np.int64)
            xt = _dtname(inputs[0].dtype)
            assert outs[4].shape == (groups, 2)
            rc = lib.vq_encode(m, d, _XT_ID[xt], _XT_ID[_dtname(ts)], groups, warps, _ptr(x), _ptr(sh), _ptr(st),
                               *map(_ptr, ins[1:]), *map(_ptr, outs))
        else:
            sh = np.array(ins[0].shape, np.int64)
            rc = lib.vq_decode(m, d, _XT_ID[_dtname(ts)], groups, warps, _ptr(ins[0]), _ptr(sh),
                               *map(_ptr, ins[1:]), *map(_ptr, outs))
        assert rc == 0, f"no emulator instantiation for {kind} M={m} D={d} TS={ts}"
        return [_from_np(o, dt) for o, dt in zip(outs, output_dtypes)]
    return call


def install(monkeypatch, tune, lib: ctypes.CDLL, max_warps: int = 4, big_warps: int = 2) -> None:
    """Make accelerated.kernels believe a GPU backend is there and run every launch in the emulator (small
    threadgroups: the emulator runs one fiber per lane). `tune`: the conftest fixture of that name."""
    from veloxquant.accelerated import kernels
    from veloxquant.accelerated.kernels import backend
    monkeypatch.setattr(backend, "available", lambda: (True, "CPU emulator"))
    monkeypatch.setattr(kernels, "available", lambda: (True, "CPU emulator"))
    monkeypatch.setattr(backend, "kernel", lambda kind, method, dtype_name: fake_kernel(lib, kind))
    tune(max_warps=max_warps, big_warps=big_warps)


def make():
    """`--impl tests._kernel_emulator:make`: the conformance suite's mlx_kernels adapter with every kernel
    launch run in the emulator (a CPU check of the whole path before a GPU run; slow, not part of CI)."""
    import sys as _sys
    from veloxquant.accelerated import kernels
    from veloxquant.accelerated.kernels import backend
    from veloxquant.conformance.adapters.mlx_kernels import MlxKernelsImpl
    lib = build()
    backend.available = lambda: (True, "CPU emulator")
    kernels.available = lambda: (True, "CPU emulator")
    backend.kernel = lambda kind, method, dtype_name: fake_kernel(lib, kind)
    # small threadgroups for the rest of this (the adapter's) process, as install's
    tuning.override(max_warps=4, big_warps=2).__enter__()
    _sys.modules.setdefault("_kernel_emulator", _sys.modules[__name__])
    return MlxKernelsImpl()
