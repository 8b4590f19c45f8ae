"""The shared kernel bodies (accelerated/kernels/source.py) executed on the CPU and compared bit for bit with
accelerated.ops (spec/methods/turboquant*.md, rabitq.md).

The GPU cannot run here, so the test builds a third prelude: C++20 with one std::thread per coordinate, a
std::barrier as BARRIER(), `static` arrays as the threadgroup memory and plain binary32 operators compiled
with -ffp-contract=off (x86-64 SSE: each op one RNE rounding). The body text is the one CUDA and Metal get,
so this checks its algorithm (fold order, butterfly pairs, crossings, packing, residuals, zero paths)
against accelerated.ops; the GPU-specific parts (intrinsics, launch, strides) are checked on a GPU by
tests/test_kernels_gpu.py and tools/kernel_check.py.
"""
from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess

import mlx.core as mx
import numpy as np
import pytest

import spec
from accelerated import ops
from accelerated.kernels import methods as kmethods
from accelerated.kernels import source
from accelerated.ops import numerics

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

PRELUDE = """
#define TID vq_tid
#define TOKEN vq_token
#define HEAD vq_head
#define BATCH vq_batch
#define NTOK vq_ntok
#define NHEAD vq_nhead
#define SHARED(type, name, n) static type name[n]
#define BARRIER() vq_bar->arrive_and_wait()
#define ADD(a, b) vq_add((a), (b))
#define SUB(a, b) vq_sub((a), (b))
#define MUL(a, b) vq_mul((a), (b))
#define DIV(a, b) vq_div((a), (b))
#define SQRT(a) std::sqrt((float)(a))
#define NEG(a) (-(a))
#define ABS(a) std::fabs((float)(a))
#define TO_F32(v) static_cast<float>(v)
"""

HARNESS = r"""
#include <array>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>
static thread_local int vq_tid;
static int vq_token, vq_head, vq_batch, vq_ntok, vq_nhead;
static std::barrier<>* vq_bar;
static inline float vq_add(float a, float b) { return a + b; }
static inline float vq_sub(float a, float b) { return a - b; }
static inline float vq_mul(float a, float b) { return a * b; }
static inline float vq_div(float a, float b) { return a / b; }
using Strides = std::array<int64_t, 10>;

template <int M>
static void enc_thread(int tid, const float* x, Strides x_strides, const float* f_sig, const float* f_tau,
    const float* f_c1, const float* f_b1, const float* f_c2, const float* f_b2, const float* f_k,
    const int32_t* meta, uint32_t* codes1, uint32_t* codes2, float* f_norm, float* f_aux) {
  vq_tid = tid;
@ENCODE@
}

template <int M>
static void dec_thread(int tid, const uint32_t* codes1, const uint32_t* codes2, const float* f_norm,
    const float* f_aux, const float* f_sig, const float* f_tau, const float* f_c1, const float* f_c2,
    const float* f_k, const int32_t* meta, float* f_out) {
  vq_tid = tid;
@DECODE@
}

template <typename F>
static void run_blocks(int d, const int32_t* g, F f) {   // g = [Q, H, B]
  vq_ntok = g[0]; vq_nhead = g[1];
  for (int b = 0; b < g[2]; ++b) for (int h = 0; h < g[1]; ++h) for (int t = 0; t < g[0]; ++t) {
    vq_batch = b; vq_head = h; vq_token = t;
    std::barrier<> bar(d); vq_bar = &bar;
    std::vector<std::thread> ths;
    for (int i = 0; i < d; ++i) ths.emplace_back(f, i);
    for (auto& th : ths) th.join();
  }
}

extern "C" void vq_encode(int m, const float* x, const int64_t* st, const float* sig, const float* tau,
    const float* c1, const float* b1, const float* c2, const float* b2, const float* k, const int32_t* meta,
    const int32_t* g, uint32_t* o1, uint32_t* o2, float* on, float* oa) {
  Strides s{}; for (int i = 0; i < 4; ++i) s[i] = st[i];
  auto go = [&](auto tag) {
    constexpr int MM = decltype(tag)::value;
    run_blocks(meta[0], g, [&](int i) {
      enc_thread<MM>(i, x, s, sig, tau, c1, b1, c2, b2, k, meta, o1, o2, on, oa); });
  };
  if (m == 0) go(std::integral_constant<int, 0>{});
  if (m == 1) go(std::integral_constant<int, 1>{});
  if (m == 2) go(std::integral_constant<int, 2>{});
  if (m == 3) go(std::integral_constant<int, 3>{});
}

extern "C" void vq_decode(int m, const uint32_t* i1, const uint32_t* i2, const float* nrm, const float* aux,
    const float* sig, const float* tau, const float* c1, const float* c2, const float* k, const int32_t* meta,
    const int32_t* g, float* out) {
  auto go = [&](auto tag) {
    constexpr int MM = decltype(tag)::value;
    run_blocks(meta[0], g, [&](int i) {
      dec_thread<MM>(i, i1, i2, nrm, aux, sig, tau, c1, c2, k, meta, out); });
  };
  if (m == 0) go(std::integral_constant<int, 0>{});
  if (m == 1) go(std::integral_constant<int, 1>{});
  if (m == 2) go(std::integral_constant<int, 2>{});
  if (m == 3) go(std::integral_constant<int, 3>{});
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("kemu")
    cpp = d / "emu.cpp"
    cpp.write_text(HARNESS.replace("@ENCODE@", PRELUDE + source.ENCODE_BODY)
                   .replace("@DECODE@", PRELUDE + source.DECODE_BODY))
    so = d / "emu.so"
    r = subprocess.run(["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC",
                        "-pthread", str(cpp), "-o", str(so)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-4000:]
    return ctypes.CDLL(str(so))


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def _np(a: mx.array) -> np.ndarray:
    return np.ascontiguousarray(np.array(a))


def emulate_encode(lib, x32: np.ndarray, p: spec.Params) -> dict[str, np.ndarray]:
    """The encode body on the CPU; x32 float32 (B, H, Q, d); fields as the kernel method names them."""
    b, h, q, d = x32.shape
    bits1, bits2 = kmethods._code_bits(p)
    sig, tau = (_np(a) for a in kmethods._signs(p, h, d))
    c1, b1, c2, b2 = (_np(a) for a in kmethods._tables(p, d))
    k = _np(kmethods._consts(d))
    meta = _np(kmethods._meta(d, bits1, bits2))
    g = np.array([q, h, b], dtype=np.int32)   # the launch grid in threadgroups
    x = np.ascontiguousarray(x32, dtype=np.float32)
    st = np.array([s // 4 for s in x.strides], dtype=np.int64)
    o1 = np.zeros((b, h, q, spec.words_per_row(d, bits1)), np.uint32)
    o2 = np.zeros((b, h, q, spec.words_per_row(d, bits2)), np.uint32)
    on = np.zeros((b, h, q), np.float32)
    oa = np.zeros((b, h, q), np.float32)
    lib.vq_encode(source.METHOD_IDS[p.method], *map(_ptr, (x, st, sig, tau, c1, b1, c2, b2, k, meta, g, o1, o2, on, oa)))
    names = kmethods.FIELDS[p.method]
    return {n: a for n, a in zip(names, (o1, o2, on, oa)) if n}


def emulate_decode(lib, fields: dict[str, np.ndarray], p: spec.Params, d: int) -> np.ndarray:
    b, h, q = fields["norm"].shape
    bits1, bits2 = kmethods._code_bits(p)
    names = kmethods.FIELDS[p.method]
    sig, tau = (_np(a) for a in kmethods._signs(p, h, d))
    c1, _, c2, _ = (_np(a) for a in kmethods._tables(p, d))
    k = _np(kmethods._consts(d))
    meta = _np(kmethods._meta(d, bits1, bits2))
    g = np.array([q, h, b], dtype=np.int32)
    i1 = np.ascontiguousarray(fields[names[0]])
    i2 = np.ascontiguousarray(fields[names[1]]) if names[1] else np.zeros(1, np.uint32)
    aux = np.ascontiguousarray(fields[names[3]]) if names[3] else np.zeros(1, np.float32)
    out = np.zeros((b, h, q, d), np.float32)
    lib.vq_decode(source.METHOD_IDS[p.method],
                  *map(_ptr, (i1, i2, np.ascontiguousarray(fields["norm"]), aux, sig, tau, c1, c2, k, meta, g, out)))
    return out


def _inputs(rng, b, h, q, d) -> np.ndarray:
    x = rng.standard_normal((b, h, q, d)).astype(np.float32)
    x[0, 0, 0] = 0.0                                  # zero vector: n = 0, r = 0
    if q > 1:
        x[0, 0, 1] = np.where(np.arange(d) % 2, 1e-42, -0.0).astype(np.float32)  # subnormals, -0
    if q > 2:
        x[-1, -1, 2] *= np.float32(1e18)              # large, still finite norm
    return x


CASES = [("turboquant", dict(bits=b)) for b in (1, 2, 3, 4)] + \
        [("turboquant_rvq", dict(bits=b, bits2=b2)) for b, b2 in ((1, 4), (2, 2), (3, 1), (4, 3))] + \
        [("rabitq", dict())] + [("turboquant_prod", dict(bits=b)) for b in (2, 3, 4, 5)]


@pytest.mark.parametrize("d", [16, 64, 128])
@pytest.mark.parametrize("method,kw", CASES, ids=[f"{m}-{'-'.join(map(str, k.values()))}" for m, k in CASES])
def test_emulated_body_matches_ops(lib, method, kw, d):
    rng = np.random.default_rng(d * 31 + len(kw))
    p = spec.Params(method, seed=7, layer=3, head_offset=5, role="v", **kw).resolved()
    x = _inputs(rng, 2, 2, 3, d)
    want = ops.method_module(method).encode(mx.array(x), p)
    got = emulate_encode(lib, x, p)
    for name, a in got.items():
        w = np.array(want[name])
        assert a.dtype == w.dtype and a.shape == w.shape, name
        diff = a.view(np.uint32) ^ w.view(np.uint32)
        assert not diff.any(), f"{name}: {np.count_nonzero(diff)} differ, XOR {np.unique(diff)[:8]}"
    fields = {n: np.array(v) for n, v in want.items() if n != "window"}
    dec = emulate_decode(lib, fields, p, d)
    dwant = np.array(ops.method_module(method).decode(want, p))
    xor = dec.view(np.uint32) ^ dwant.view(np.uint32)
    assert not xor.any(), f"decode: {np.count_nonzero(xor)} differ, XOR {np.unique(xor)[:8]}"


def test_emulated_strided_input(lib):
    """x read through its strides (a transposed view), as the encode kernel does for windows and views."""
    rng = np.random.default_rng(1)
    p = spec.Params("turboquant", bits=3).resolved()
    base = rng.standard_normal((2, 4, 3, 32)).astype(np.float32)     # (B, Q, H, d) in memory
    x = base.transpose(0, 2, 1, 3)                                    # (B, H, Q, d) view
    b, h, q, d = x.shape
    sig, tau = (_np(a) for a in kmethods._signs(p, h, d))
    c1, b1, c2, b2 = (_np(a) for a in kmethods._tables(p, d))
    meta = _np(kmethods._meta(d, 3, 1))
    g = np.array([q, h, b], dtype=np.int32)
    st = np.array([s // 4 for s in x.strides], dtype=np.int64)
    o1 = np.zeros((b, h, q, spec.words_per_row(d, 3)), np.uint32)
    on = np.zeros((b, h, q), np.float32)
    z = np.zeros(1, np.uint32)
    zf = np.zeros(1, np.float32)
    lib.vq_encode(0, *map(_ptr, (base, st, sig, tau, c1, b1, c2, b2, _np(kmethods._consts(d)), meta, g, o1, z, on, zf)))
    want = ops.encode(mx.array(np.ascontiguousarray(x)), p)
    assert np.array_equal(o1, np.array(want["codes"]))
    assert np.array_equal(on.view(np.uint32), np.array(want["norm"]).view(np.uint32))
