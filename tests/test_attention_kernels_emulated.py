"""The decode-attention kernel bodies (accelerated/kernels/attention_source.py) executed on the CPU against
accelerated.ops.attention and a float64 evaluation over the decoded records (tolerance tier).

No GPU here, so a third prelude runs the shared body as C++20: each GPU thread a fiber on the calling OS
thread (tests/_fibers.py), a barrier per threadgroup (BARRIER) and one per warp (SHFL_XOR exchanges through memory
between two warp barriers), `static` arrays as threadgroup memory. A barrier switches to the next runnable fiber;
with `reverse` the fibers resume against lane order as the blocks run against x order, so an order a kernel
wrongly relies on shows the same way on every run. The launch description (inputs, templates, grids)
is accelerated.kernels.attention.launch_plan itself, and every record field reaches the body as a strided
view inside a larger buffer, as the caches' buffers do. What it cannot check (the intrinsics, MLX's launch,
occupancy) is checked on a GPU by tests/test_attention_gpu.py and benchmarks/test_decode_step.py.
"""
from __future__ import annotations

import ctypes
import functools
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import tuning
from veloxquant.accelerated.kernels import append as kfused
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import methods as km_
from veloxquant.accelerated.kernels import attention_source as src
from veloxquant.accelerated.ops import attention as oatt
import _kernel_emulator as ke
from _fibers import FIBERS
from _attention_util import f64_attention, packed

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

PRELUDE = """
#define TID vq_tid
#define BLOCK_X vq_bx
#define BLOCK_Y vq_by
#define BLOCK_Z vq_bz
#define NBLOCK_X vq_nx
#define NBLOCK_Y vq_ny
#define NBLOCK_Z vq_nz
#define SHARED(type, name, n) static type name[n]
#define BARRIER() vq_bar->arrive_and_wait()
#define SHFL_XOR(v, m) vq_shfl((v), (m))
#define SHFL_IDX(v, i) vq_shfl_idx((v), (i))
#define VQ_BARRIER() vq_bar->arrive_and_wait()
#define THREADFENCE() std::atomic_thread_fence(std::memory_order_seq_cst)
#define ATOMIC_ADD(p, i) __atomic_fetch_add(const_cast<int32_t*>(p) + (i), 1, __ATOMIC_SEQ_CST)
#define COUNT_RESET(p, i) (const_cast<int32_t*>(p)[(i)] = 0)
#define WARP_SYNC() vq_warp_bar[vq_tid / 32]->arrive_and_wait()
"""

HEADER = r"""
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
""" + FIBERS + r"""
static inline float vq_max(float a, float b) { return std::fmax(a, b); }
static inline int vq_min(int a, int b) { return a < b ? a : b; }
#define DEVICE
#define TGMEM
#define THREAD
#define NEG_INF (-INFINITY)
using Arr = std::array<int64_t, 10>;
struct vq_bf16 {
  uint16_t bits;
  vq_bf16() = default;
  explicit vq_bf16(float f) { uint32_t u; std::memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); bits = u >> 16; }
  operator float() const { uint32_t u = (uint32_t)bits << 16; float f; std::memcpy(&f, &u, 4); return f; }
};
static int vq_tid;
static int vq_bx, vq_by, vq_bz;     // each thread's block; these and vq_tid are a fiber's own (vq_run registers them)
static int vq_nx, vq_ny, vq_nz;
static VqBarrier* vq_bar;
static VqBarrier* vq_warp_bar[32];
static float vq_xchg[1024];
static inline float vq_shfl(float v, int m) {
  const int w = vq_tid / 32;
  vq_xchg[vq_tid] = v;
  vq_warp_bar[w]->arrive_and_wait();
  const float r = vq_xchg[(vq_tid & ~31) | ((vq_tid & 31) ^ m)];
  vq_warp_bar[w]->arrive_and_wait();
  return r;
}
template <class T, class F>
static inline T vq_bits(F v) { static_assert(sizeof(T) == sizeof(F)); T t; std::memcpy(&t, &v, sizeof t); return t; }
// the integer shuffles (the encode body's in APPEND, the tensor-core loop's table lookups): the float exchange's bits
static inline uint32_t vq_shfl(uint32_t v, int m) { return vq_bits<uint32_t>(vq_shfl(vq_bits<float>(v), m)); }
static inline float vq_shfl_idx(float v, int src) {
  const int w = vq_tid / 32;
  vq_xchg[vq_tid] = v;
  vq_warp_bar[w]->arrive_and_wait();
  const float r = vq_xchg[(vq_tid & ~31) | (src & 31)];
  vq_warp_bar[w]->arrive_and_wait();
  return r;
}
static inline uint32_t vq_shfl_idx(uint32_t v, int src) {
  return vq_bits<uint32_t>(vq_shfl_idx(vq_bits<float>(v), src));
}
// the tensor-core loop's helpers (accelerated/kernels/attention_tc.py TC_CUDA_HEADER): the same operations in
// plain C++; mma.m16n8k16 as a warp exchange, products and sums in double (the hardware's accumulation order
// and rounding are its own: the GPU run of the suite checks those against the same budget)
static inline uint32_t vq_h2(float lo, float hi) {
  const _Float16 a = (_Float16)lo, b = (_Float16)hi;
  uint16_t x, y;
  std::memcpy(&x, &a, 2);
  std::memcpy(&y, &b, 2);
  return (uint32_t)x | ((uint32_t)y << 16);
}
static inline float vq_hround(float x) { return (float)(_Float16)x; }
// __fdividef: the reciprocal, then the product (the GPU's reciprocal is within 1 ulp; this one is rounded)
static inline float vq_fdiv(float a, float b) { return a * (1.0f / b); }
static inline uint32_t vq_perm(uint32_t a, uint32_t b, uint32_t sel) {
  const uint64_t v = (uint64_t)a | ((uint64_t)b << 32);
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= (uint32_t)((v >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
}
static inline float vq_pow2_for(float mx, int e) {
  int x;
  std::frexp(mx, &x);
  const int sh = e - x;
  return std::ldexp(1.0f, sh < -100 ? -100 : (sh > 100 ? 100 : sh));
}
static int vq_anyx[1024];
static inline bool vq_any(bool p) {
  const int w = vq_tid / 32;
  vq_anyx[vq_tid] = p ? 1 : 0;
  vq_warp_bar[w]->arrive_and_wait();
  bool r = false;
  for (int l = 0; l < 32; ++l) r = r || vq_anyx[(vq_tid & ~31) + l] != 0;
  vq_warp_bar[w]->arrive_and_wait();
  return r;
}
#define VQ_ANY(p) vq_any((p))
static inline uint32_t vq_ballot(bool p) {
  const int w = vq_tid / 32;
  vq_anyx[vq_tid] = p ? 1 : 0;
  vq_warp_bar[w]->arrive_and_wait();
  uint32_t r = 0;
  for (int l = 0; l < 32; ++l) r |= (uint32_t)(vq_anyx[(vq_tid & ~31) + l] != 0) << l;
  vq_warp_bar[w]->arrive_and_wait();
  return r;
}
template <typename T> static inline T vq_to(float f) { return T(f); }
static inline float vq_flip(float v, uint32_t m) { uint32_t u; std::memcpy(&u, &v, 4); u ^= m; std::memcpy(&v, &u, 4); return v; }
static uint32_t vq_mxa[1024][4];
static uint32_t vq_mxb[1024][2];
static inline float vq_hf(uint32_t v, int k) {
  const uint16_t x = (uint16_t)(v >> (16 * (k % 2)));
  _Float16 f;
  std::memcpy(&f, &x, 2);
  return (float)f;
}
static inline void vq_mma(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  const int w = vq_tid / 32, base = vq_tid & ~31, lane = vq_tid & 31, g = lane >> 2, tig = lane & 3;
  vq_mxa[vq_tid][0] = a0; vq_mxa[vq_tid][1] = a1; vq_mxa[vq_tid][2] = a2; vq_mxa[vq_tid][3] = a3;
  vq_mxb[vq_tid][0] = b0; vq_mxb[vq_tid][1] = b1;
  vq_warp_bar[w]->arrive_and_wait();
  double acc[4];
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i / 2), n = 2 * tig + i % 2;
    double y = d[i];
    for (int k = 0; k < 16; ++k) {
      const float av = vq_hf(vq_mxa[base + (r % 8) * 4 + (k % 8) / 2][(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k);
      const float bv = vq_hf(vq_mxb[base + n * 4 + (k % 8) / 2][k >= 8 ? 1 : 0], k);
      y += (double)av * (double)bv;
    }
    acc[i] = y;
  }
  vq_warp_bar[w]->arrive_and_wait();
  for (int i = 0; i < 4; ++i) d[i] = (float)acc[i];
}
template <int N>
static inline void vq_words(const uint32_t* p, uint32_t* out) { for (int i = 0; i < N; ++i) out[i] = p[i]; }
static inline float vq_exp2(float x) { return std::exp2(x); }
static inline float vq_round_to(float, float x) { return x; }
static inline float vq_round_to(_Float16, float x) { return (float)(_Float16)x; }
static inline float vq_round_to(vq_bf16, float x) { return (float)vq_bf16(x); }
@HELPERS@
// blocks of a launch run one after the other, in x order or (vq_reverse) against it: a GPU gives no order, so a block
// that reads what another block of the launch writes shows in one of the two. The launch's nt threads (fibers,
// tests/_fibers.py; vq_reverse also resumes them against lane order) run every block in turn: a block starts once
// every thread is done with the one before (the `next` barrier), as when each block's threads were joined first.
static int vq_reverse = 0;
extern "C" void vq_set_reverse(int r) { vq_reverse = r; }
template <typename F>
static void vq_run(int nt, int gx, int gy, int gz, F f) {
  vq_nx = gx; vq_ny = gy; vq_nz = gz;
  vq_fiber_reverse = vq_reverse;
  vq_fiber_vars({&vq_tid, &vq_bx, &vq_by, &vq_bz});
  VqBarrier bar(0, nt), next(0, nt);
  vq_bar = &bar;
  std::vector<VqBarrier> wb;
  for (int w = 0; w < (nt + 31) / 32; ++w) wb.emplace_back(32 * w, std::min(32, nt - 32 * w));
  for (int w = 0; w < (int)wb.size(); ++w) vq_warp_bar[w] = &wb[w];
  auto thread = [&](int i) {
    for (int z = 0; z < gz; ++z) for (int y = 0; y < gy; ++y) for (int x = 0; x < gx; ++x) {
      vq_bx = vq_reverse ? gx - 1 - x : x; vq_by = y; vq_bz = z;
      f(i);
      next.arrive_and_wait();
    }
  };
  vq_fibers_run(nt, thread);
}
"""

# the encode body's macros (APPEND: the decode step's append inside the partial, attention_source.append_block), in
# terms of this emulation's shuffles; plain binary32 operators (no FMA on x86-64 without -mfma)
ENCODE_MACROS = """
#define LANE (vq_tid & 31)
#define SHFL_DOWN(v, s) vq_shfl_idx((v), (vq_tid & 31) + (int)(s) < 32 ? (vq_tid & 31) + (int)(s) : (vq_tid & 31))
#define SHFL(v, l) vq_shfl_idx((v), (int)(l))
#define ANY(p) vq_any((p))
#define BALLOT(p) vq_ballot((p))
#define ADD(a, b) ((float)(a) + (float)(b))
#define SUB(a, b) ((float)(a) - (float)(b))
#define MUL(a, b) ((float)(a) * (float)(b))
#define DIV(a, b) ((float)(a) / (float)(b))
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
#define VQ_B1 B1
#define VQ_B2 B2
#define VQ_GS GS
#define VQ_KR KR
#define VQ_DEV
#define VQ_TG
#define VQ_REF const auto&
#define VQ_MUT(type, p) const_cast<type*>(p)
#define VQ_BARRIER() vq_bar->arrive_and_wait()
"""

CTYPES = {mx.float16: "_Float16", mx.bfloat16: "vq_bf16", mx.float32: "float", mx.uint32: "uint32_t",
          mx.bool_: "bool", mx.int32: "int32_t"}
NP_VIEW = {mx.float16: np.float16, mx.bfloat16: np.uint16, mx.float32: np.float32, mx.uint32: np.uint32,
           mx.bool_: np.bool_, mx.int32: np.int32}


def _params(names, types, shaped):
    out = []
    for n in names:
        out.append(f"const {types[n]}* {n}")
        if n in shaped:
            out.append(f"Arr {n}_shape")
            out.append(f"Arr {n}_strides")
    return out


def _source(plan: katt.Plan, in_types: dict, out_type: str) -> str:
    append = len(plan.key) > 6 and plan.key[6]
    starts = len(plan.key) > 7 and plan.key[7]
    ragged = len(plan.key) > 8 and plan.key[8]      # (accelerated/cache/ragged.py: rows of their own KIVI phase)
    whole = len(plan.key) > 9 and plan.key[9]       # (tuning's whole_windows: csrc/window_bind.h first)
    p_ins, c_ins = plan.partial_names, src.inputs("combine", append=append)
    types = {**in_types, "o_acc": "float", "o_ml": "float", "f_c": "float", "tok": "bool"}
    # (a MIXED tensor-core partial's scalar splits: the defines a CUDA launch's header takes from the tuning)
    pbody = (src.mixed_defines(*src.mixed_knobs(plan.key[4], plan.key[2], ragged))
             + (src.whole_windows(plan.key[2], append) if whole else "")
             + (src.append_block(*plan.key[:3], ragged=ragged) if append else "")
             + src.aliases("partial", *plan.key[:4], append=append, starts=starts, ragged=ragged)
             + src.partial_body(plan.key[0], plan.key[1], plan.key[4]))
    cbody = src.aliases("combine") + (src.COMBINE_SUMMARY if append else "") + src.COMBINE_BODY
    p_shaped = [n for n in p_ins if f"{n}_shape" in pbody or f"{n}_strides" in pbody]
    c_shaped = [n for n in c_ins if f"{n}_shape" in cbody or f"{n}_strides" in cbody]
    consts = "".join(f"  constexpr int {k} = {v};\n" if isinstance(v, int) else f"  using {k} = {CTYPES[v]};\n"
                     for k, v in plan.partial_template if k != "OT")
    consts += f"  using OT = {out_type};\n"
    cconsts = "".join(f"  constexpr int {k} = {v};\n" for k, v in plan.combine_template if k != "OT")
    p_sig = ", ".join(["int vq_thread"] + _params(p_ins, types, p_shaped) + ["float* o_acc", "float* o_ml"]
                      + ([f"{out_type}* out"] if plan.fused else ["bool* token"] if append else []))
    c_sig = ", ".join(["int vq_thread"] + _params(c_ins, types, c_shaped) + [f"{out_type}* out"]
                      + (["bool* summary"] if append else []))
    # the C entry points take every input as (pointer, shape[10], strides[10]) in input order
    def call(names, shaped):
        args = []
        for i, n in enumerate(names):
            args.append(f"(const {types[n]}*)ptr[{i}]")
            if n in shaped:
                args.append(f"arr(sh, {i})")
                args.append(f"arr(st, {i})")
        return ", ".join(args)
    return (HEADER.replace("@HELPERS@", "#define VQ_INLINE static inline\n" + src.HELPERS) + PRELUDE
            + (ENCODE_MACROS if append else "")
            + f"static Arr arr(const int64_t* a, int i) {{ Arr r; for (int k = 0; k < 10; ++k) r[k] = a[i * 10 + k]; return r; }}\n"
            + f"static void partial_thread({p_sig}) {{\n  vq_tid = vq_thread;\n{consts}{pbody}\n}}\n"
            + "#undef cnt\n#undef out\n#undef f_k\n"    # the partial's aliases (MLX compiles each kernel alone)
            + f"static void combine_thread({c_sig}) {{\n  vq_tid = vq_thread;\n  using OT = {out_type};\n{cconsts}{cbody}\n}}\n"
            + "extern \"C\" void run_partial(void** ptr, const int64_t* sh, const int64_t* st, float* o_acc, "
              f"float* o_ml, {out_type}* out, int nt, int gx, int gy, int gz) {{\n"
            + f"  vq_run(nt, gx, gy, gz, [&](int i) {{ partial_thread(i, {call(p_ins, p_shaped)}, o_acc, o_ml"
            + (", out" if plan.fused else ", (bool*)out" if append else "") + "); });\n}\n"
            + f"extern \"C\" void run_combine(void** ptr, const int64_t* sh, const int64_t* st, {out_type}* out, "
              "int nt, int gx, int gy, int gz, bool* summary) {\n"
            + f"  vq_run(nt, gx, gy, gz, [&](int i) {{ combine_thread(i, {call(c_ins, c_shaped)}, out"
            + (", summary" if append else "") + "); });\n}\n")


@functools.lru_cache(maxsize=None)
def _compile(text: str) -> ctypes.CDLL:
    d = Path(tempfile.gettempdir()) / "vq_attention_emulated"
    d.mkdir(exist_ok=True)
    # (no contraction either: the append inside a partial is compared by its bytes)
    return ke.compile_library(text, prefix="k", folder=d, flags=ke.EXACT_FLAGS)


def _strided(a: mx.array, pad: int) -> np.ndarray:
    """a inside a buffer with `pad` more rows on axis 2, all bits set (NaN as floats): the caches pass their
    whole buffers and the encoded count (nenc), so a kernel reading a row past it would show."""
    n = np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a).astype(NP_VIEW[a.dtype], copy=False)
    if n.ndim >= 3 and pad:
        big = np.empty(n.shape[:2] + (n.shape[2] + pad,) + n.shape[3:], n.dtype)
        big.view(np.uint8)[...] = 0xFF
        big[:, :, : n.shape[2]] = n
        n = big
    return n


_FIELD_INPUTS = {"kc1", "kc2", "ks0", "ks1", "kgs", "kgz", "vc1", "vc2", "vs0", "vs1", "vgs", "vgz"}


def _marshal(arrays: list[np.ndarray]):
    ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    sh = np.zeros((len(arrays), 10), np.int64)
    st = np.zeros((len(arrays), 10), np.int64)
    for i, a in enumerate(arrays):
        sh[i, : a.ndim] = a.shape
        st[i, : a.ndim] = [s // a.itemsize for s in a.strides]
    return ptrs, sh, st


def emulate(queries: mx.array, k: oatt.PackedRecord, v: oatt.PackedRecord, scale: float, mask=None,
            append: tuple | None = None, poison_below: list | None = None, reverse: bool = False,
            mixed: bool = False) -> np.ndarray:
    """The partial and combine launches on the CPU. `append` = (new keys, new values, keys' params, values' params,
    poisoned): the decode step's append inside the partial launch (APPEND) for the last t tokens of the records,
    whose rows in the buffers are set to all ones first when `poisoned` (so the kernel must write them); returns
    (output, {field input name: its rows as the kernel left them}, the token, the combine's summary of it) then.
    With exact windows (R > 0, the records' windows: the state after the step) the append moves them
    (kernels/append.py WINDOWED): kf / vf, the t tokens leaving each window (`append`'s sixth item, (kf, vf)), sit
    just before the window in one buffer, whose last t rows are all ones (the chunk's, to be written); the rows then
    also hold "kw" / "vw", the window as the launch left it. `append`'s seventh item: the tokens the launch encodes
    where not the chunk's t (KIVI's window: 0, or a group of G; kf / vf hold them). `reverse`: the blocks of each
    launch run in reverse order (the last split first). `mixed`: the MIXED partial (roles whose encoded counts
    differ: attention_source.MIXED_WINDOWS); `append`'s seventh and eighth items are then (keys', values'), its
    sixth (kf or None, vf or None): a role without a window has none."""
    extra = ats = None
    if append is not None:
        kx, vx, kp, vp, poisoned = append[:5]
        nq = append[6] if len(append) > 6 else None
        own = append[7] if len(append) > 7 else 0
        (knq, vnq), (kown, vown) = (nq if isinstance(nq, tuple) else (nq, nq)), (own if isinstance(own, tuple)
                                                                                  else (own, own))
        d = kx.shape[3]
        extra = {"kx": kx, "kconst": kfused.constants(kp, kx.shape[1], kx.shape[2], d, knq, kown), "vx": vx,
                 "vconst": kfused.constants(vp, vx.shape[1], vx.shape[2], d, vnq, vown)}
        ats = (km_._side_dtype(kp, kx.dtype), km_._side_dtype(vp, vx.dtype), kx.dtype, vx.dtype)
        if len(append) > 5:
            extra.update({f"{r}f": f for r, f in zip("kv", append[5]) if f is not None})
    plan = katt.launch_plan(queries, k, v, scale, mask, None if append is None else mx.zeros((1,), mx.bool_), ats,
                            extra, mixed)
    ins = [_strided(a, 3 if name in _FIELD_INPUTS else 0) for name, a in zip(plan.partial_names, plan.partial_inputs)]
    if poison_below is not None:       # rows a RowStarts mask hides: all bits set (NaN norms), never to be read
        for name, a in zip(plan.partial_names, ins):
            if name in _FIELD_INPUTS:
                # KIVI keys' scale and zero rows are groups of KG tokens: those wholly below the start
                kg = dict(plan.partial_template)["KG"] if name in ("kgs", "kgz") and plan.key[0] == src.METHOD_IDS["kivi"] else 1
                for bi, s0 in enumerate(poison_below):
                    a[bi, :, :s0 // kg].view(np.uint8)[...] = 0xFF
    if append is not None and poisoned:
        for name, a in zip(plan.partial_names, ins):
            if name in _FIELD_INPUTS:       # the encoded rows (a group field: KIVI keys' scale, zero, q / G rows)
                t = append[0].shape[2] if (knq if name[0] == "k" else vnq) is None else (knq if name[0] == "k" else vnq)
                q = (k if name[0] == "k" else v).encoded
                n = a.shape[2] - 3
                a[:, :, n - n * t // q: n].view(np.uint8)[...] = 0xFF
    wins = {}
    if append is not None and len(append) > 5:     # each window after its leaving tokens in one buffer, its new rows poisoned
        for r, own in (("k", kown), ("v", vown)):
            if f"{r}f" not in plan.partial_names:     # (MIXED: a role without a window)
                continue
            iw, i_f = plan.partial_names.index(f"{r}w"), plan.partial_names.index(f"{r}f")
            w, f = ins[iw], _strided(extra[f"{r}f"], 0)
            t, new = f.shape[2], append[0].shape[2]
            # the kernel copies the chunk into the window's last rows (csrc/check_count_window.h vq_wrow = its rows -
            # the chunk's): fewer rows than the chunk's would write in front of the buffer (KIVI with R = 0 at a
            # flush: the launch's window is the chunk's row, `own`)
            assert w.shape[2] >= new, f"{r}w: {w.shape[2]} rows for a chunk of {new} (own {own})"
            # (own: kf's last rows are the window's first, the chunk's rows: one buffer row each, as in the stream)
            buf = np.concatenate([f[:, :, :t - own], w, np.zeros(w.shape[:2] + (2,) + w.shape[3:], w.dtype)], axis=2)
            t -= own
            buf[:, :, t + w.shape[2] - new: t + w.shape[2]].view(np.uint8)[...] = 0xFF
            ins[i_f], ins[iw] = buf[:, :, :t + own], buf[:, :, t:t + w.shape[2]]
            wins[f"{r}w"] = buf[:, :, t:t + w.shape[2]]
    in_types = {n: CTYPES[a.dtype] for n, a in zip(plan.partial_names, plan.partial_inputs)}
    out_type = CTYPES[queries.dtype]
    lib = _compile(_source(plan, in_types, out_type))
    lib.vq_set_reverse(int(reverse))
    (acc_shape, _), (ml_shape, _) = plan.partial_outputs[:2]
    o_acc = np.full(acc_shape, np.nan, np.float32)
    o_ml = np.full(ml_shape, np.nan, np.float32)
    out = np.zeros(plan.out_shape, NP_VIEW[queries.dtype])
    token = np.ones(plan.partial_outputs[2][0], np.bool_) if append is not None else None
    ptrs, sh, st = _marshal(ins)
    gx, gy, gz = plan.partial_grid
    nt = dict(plan.partial_template)["NT"]
    lib.run_partial(ptrs, sh.ctypes.data_as(ctypes.c_void_p), st.ctypes.data_as(ctypes.c_void_p),
                    o_acc.ctypes.data_as(ctypes.c_void_p), o_ml.ctypes.data_as(ctypes.c_void_p),
                    (out if token is None else token).ctypes.data_as(ctypes.c_void_p), nt, gx // nt, gy, gz)
    if plan.fused:     # the counters are back at zero for the next launch
        assert not ins[plan.partial_names.index("cnt")].any(), "fused partial: a counter left non-zero"
    else:
        cins = [o_acc, o_ml, ins[1], ins[0]] + ([token] if token is not None else [])   # o_acc, o_ml, f_c, q[, tok]
        ptrs, sh, st = _marshal(cins)
        gx, gy, gz = plan.combine_grid
        summary = np.ones((2, 1, 2), np.bool_)      # every slot must be written
        lib.run_combine(ptrs, sh.ctypes.data_as(ctypes.c_void_p), st.ctypes.data_as(ctypes.c_void_p),
                        out.ctypes.data_as(ctypes.c_void_p), plan.combine_threads, gx // plan.combine_threads, gy, gz,
                        summary.ctypes.data_as(ctypes.c_void_p))
    if queries.dtype == mx.bfloat16:
        res = np.array(mx.array(out).view(mx.bfloat16).astype(mx.float32))
    else:
        res = out.astype(np.float32)
    if append is None:
        return res
    rows = {n: a[:, :, :(k if n[0] == "k" else v).encoded] for n, a in zip(plan.partial_names, ins)
            if n in _FIELD_INPUTS}
    rows.update(wins)
    return res, rows, token, summary


_packed = packed


CASES = [
    # key method/kw, value method/kw, (B, Hkv, rep, L, T, d, window), queries dtype, causal
    (("turboquant", dict(bits=4)), ("turboquant", dict(bits=4)), (1, 2, 4, 1, 300, 128, 0), mx.float16, False),
    (("turboquant", dict(bits=3)), ("turboquant_rvq", dict(bits=2, bits2=2)), (2, 2, 2, 3, 200, 64, 5), mx.float16, True),
    (("turboquant_prod", dict(bits=4)), ("turboquant_prod", dict(bits=3)), (1, 2, 3, 1, 150, 64, 3), mx.bfloat16, False),
    (("rabitq", {}), ("rabitq", {}), (1, 1, 2, 2, 90, 32, 0), mx.float32, True),
    (("kivi", dict(bits=2, group_size=16)), ("kivi", dict(bits=3, group_size=16)), (1, 2, 2, 1, 260, 64, 16), mx.float16, False),
    (("mlx_affine", dict(bits=4, group_size=32)), ("mlx_affine", dict(bits=8, group_size=32)), (1, 2, 1, 4, 120, 64, 0), mx.float16, True),
    (("turboquant", dict(bits=2)), ("kivi", dict(bits=4, group_size=32)), (1, 1, 5, 1, 64, 256, 0), mx.float16, False),
    (("turboquant_rvq", dict(bits=1, bits2=3)), ("turboquant", dict(bits=1)), (1, 1, 1, 1, 40, 16, 2), mx.float16, False),
]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "combine-launch"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0][0]}-{c[1][0]}-d{c[2][5]}" for c in CASES])
def test_kernel_bodies_match_ops_attention_and_float64(case, fused, monkeypatch, tune):
    """fused: the combine inside the partial launch; combine-launch: its own launch (CUDA's and Metal's). Splits of
    8 tokens, so that the combine merges more splits (5-38) than it has thread groups over them (CG = 4-32)."""
    tune(fuse_combine=fused)
    tune(tokens_per_split=8)
    (km, kkw), (vm, vkw), (b, hkv, rep, lq, t, d, win), qdt, causal = case
    rng = np.random.default_rng(sum(map(ord, km + vm)) + d)
    kp = spec.Params(km, role="k", window=win, seed=9, layer=2, head_offset=1, **kkw).resolved()
    vp = spec.Params(vm, role="v", window=win, seed=9, layer=2, head_offset=1, **vkw).resolved()
    kx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
    vx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
    q = mx.array((rng.standard_normal((b, hkv * rep, lq, d)) * 2).astype(np.float32)).astype(qdt)
    k, v = _packed(kx, kp), _packed(vx, vp)
    scale = 1.0 / np.sqrt(d)
    mask = "causal" if causal else None
    _check_body(emulate(q, k, v, scale, mask), q, k, v, scale, causal, qdt)


def _check_body(got, q, k, v, scale, causal, qdt):
    """An emulated kernel body's output `got` against float64 over the records' own decode and against the ops
    path over the records k, v as stored."""
    ops_out = np.array(oatt.attention(q, k, v, scale, "causal" if causal else None).astype(mx.float32))
    want = f64_attention(np.array(q.astype(mx.float32)), np.array(k.dequantized()), np.array(v.dequantized()),
                         scale, causal)
    # output dtype rounding (bf16: 2^-8 relative) dominates; float32 attention error is far below it
    tol = {mx.float32: 2e-5, mx.float16: 2e-3, mx.bfloat16: 1.6e-2}[qdt] * np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg="kernel body vs float64")
    np.testing.assert_allclose(got, ops_out, rtol=0, atol=2 * tol, err_msg="kernel body vs ops path")


ROW_START_CASES = [
    # key method/kw, value method/kw, (Hkv, rep, L, T, d), starts per batch row, queries dtype, causal
    (("turboquant", dict(bits=4)), ("turboquant", dict(bits=4)), (2, 4, 1, 120, 128), [0, 37, 119], mx.float16, False),
    (("rabitq", {}), ("turboquant_rvq", dict(bits=2, bits2=2)), (1, 2, 3, 90, 64), [5, 0, 60], mx.float32, True),
    (("turboquant_prod", dict(bits=3)), ("mlx_affine", dict(bits=4, group_size=32)), (2, 2, 1, 70, 64), [69, 8],
     mx.bfloat16, False),
    (("mlx_affine", dict(bits=8, group_size=64)), ("turboquant", dict(bits=2)), (1, 3, 2, 50, 64), [17, 33, 1],
     mx.float16, True),
]


def _row_start_case(case, run, fused=False):
    (km, kkw), (vm, vkw), (hkv, rep, lq, t, d), starts, qdt, causal = case
    b = len(starts)
    rng = np.random.default_rng(t + d + b)
    kp = spec.Params(km, role="k", window=0, seed=4, layer=3, **kkw).resolved()
    vp = spec.Params(vm, role="v", window=0, seed=4, layer=3, **vkw).resolved()
    kx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
    vx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
    q = mx.array((rng.standard_normal((b, hkv * rep, lq, d)) * 2).astype(np.float32)).astype(qdt)
    k, v = _packed(kx, kp), _packed(vx, vp)
    scale = 1.0 / np.sqrt(d)
    mask = oatt.RowStarts(mx.array(starts, dtype=mx.int32), causal)
    got = run(q, k, v, scale, mask)
    qf, kd, vd = np.array(q.astype(mx.float32)), np.array(k.dequantized()), np.array(v.dequantized())
    want = np.concatenate([f64_attention(qf[i:i + 1], kd[i:i + 1, :, s0:], vd[i:i + 1, :, s0:], scale, causal)
                           for i, s0 in enumerate(starts)])
    tol = {mx.float32: 2e-5, mx.float16: 2e-3, mx.bfloat16: 1.6e-2}[qdt] * np.abs(want).max()
    return got, want, tol, (q, k, v, scale, mask)


# the combine launch (what a decode step runs on CUDA and Metal) for every case, the fused combine for the first: the
# row starts change the splits' token ranges, not the merge (each case's compile costs seconds on the CI machine)
ROW_START_RUNS = [(c, False) for c in ROW_START_CASES] + [(ROW_START_CASES[0], True)]


@pytest.mark.parametrize("case, fused", ROW_START_RUNS, ids=[f"{c[0][0]}-{c[1][0]}-starts{c[3]}-"
                                                             f"{'fused' if f else 'combine-launch'}"
                                                             for c, f in ROW_START_RUNS])
def test_row_starts_attend_each_batch_row_from_its_start(case, fused, monkeypatch, tune):
    """A RowStarts mask (a left-padded batch, accelerated/cache/batch_shared.py): batch row b attends to its tokens
    from starts[b] on only. The kernel bodies (scalar loop; splits of 8 tokens, so that starts fall inside, at the
    edge of and past whole splits) against float64 over each row's own tokens, with the rows below the starts as
    stored (an attended one would change the output) and with all their bits set, and the ops path likewise."""
    tune(fuse_combine=fused)
    tune(tokens_per_split=8)
    for poison in (None, case[3]):
        got, want, tol, args = _row_start_case(case, lambda q, k, v, scale, mask: emulate(
            q, k, v, scale, mask, poison_below=poison))
        np.testing.assert_allclose(got, want, rtol=0, atol=tol,
                                   err_msg=f"kernel bodies with row starts {case[3]}, poisoned below: {poison}")
    plan = katt.launch_plan(*args)
    assert plan.key[7] and "rstart" in plan.partial_names, plan.key
    ops_out = np.array(oatt.attention(*args).astype(mx.float32))
    np.testing.assert_allclose(ops_out, want, rtol=0, atol=tol, err_msg=f"ops path with row starts {case[3]}")


def test_row_starts_in_the_tensor_core_loop(tensor_cores, monkeypatch, tune):
    """The tensor-core loop (turboquant b4, d = 128) with row starts inside a 16-token chunk and past a split."""
    tune(tokens_per_split=32)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    case = (("turboquant", dict(bits=4)), ("turboquant", dict(bits=4)), (2, 4, 1, 300, 128), [0, 7, 250],
            mx.float32, False)
    for poison in (None, case[3]):
        got, want, tol, args = _row_start_case(case, lambda q, k, v, scale, mask: emulate(
            q, k, v, scale, mask, poison_below=poison))
        np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=f"tensor-core loop, poisoned below: {poison}")
    assert katt.launch_plan(*args).key[4], "not the tensor-core loop"


@pytest.mark.parametrize("pairs", [False, True], ids=["one", "kpairs"])
def test_row_starts_in_the_tensor_core_loop_for_kivi(pairs, tensor_cores, monkeypatch, tune):
    """The KIVI tensor-core loop (tuning's tc_kivi) with row starts inside a 16-token chunk (the chunks start at
    16-token boundaries below a split's first token, 32 with tc_kpairs: the rows below the start are read as the
    start's) and past a split, with the rows below the starts as stored and with all their bits set."""
    tune(tokens_per_split=32, tc_kivi=True, tc_kpairs=pairs)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    case = (("kivi", dict(bits=2, group_size=32)), ("kivi", dict(bits=2, group_size=32)), (2, 4, 1, 300, 128),
            [0, 7, 250], mx.float32, False)
    for poison in (None, case[3]):
        got, want, tol, args = _row_start_case(case, lambda q, k, v, scale, mask: emulate(
            q, k, v, scale, mask, poison_below=poison))
        np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=f"tensor-core loop, poisoned below: {poison}")
    assert katt.launch_plan(*args).key[4], "not the tensor-core loop"


def test_row_starts_in_the_tensor_core_loop_for_mlx_affine(tensor_cores, monkeypatch, tune):
    """The mlx_affine tensor-core loop (tuning's tc_affine) with row starts inside a 16-token chunk and past a split,
    with the rows below the starts as stored and with all their bits set (NaN scales and biases: never read)."""
    tune(tokens_per_split=32, tc_affine=True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    case = (("mlx_affine", dict(bits=4, group_size=64)), ("mlx_affine", dict(bits=2, group_size=32)),
            (2, 4, 1, 300, 128), [0, 7, 250], mx.float32, False)
    for poison in (None, case[3]):
        got, want, tol, args = _row_start_case(case, lambda q, k, v, scale, mask: emulate(
            q, k, v, scale, mask, poison_below=poison))
        np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=f"tensor-core loop, poisoned below: {poison}")
    assert katt.launch_plan(*args).key[4], "not the tensor-core loop"


TC_SPLIT_FRACTION = 2.0 ** -6     # of conformance's attention budget, for float32 outputs (see the test)
TC_CASES = [
    # (B, Hkv, rep, L, T, d), queries dtype, causal, query scale, value scale
    ((1, 2, 4, 1, 300, 128), mx.float32, False, 2.0, 1.0),
    ((1, 1, 2, 2, 75, 64), mx.float16, True, 2.0, 1.0),
    ((2, 1, 1, 1, 40, 128), mx.float32, False, 1e-3, 3e4),     # one partial chunk per split; tiny q, big norms
    ((1, 1, 4, 1, 530, 128), mx.bfloat16, False, 40.0, 1e-3),
    ((1, 2, 4, 1, 600, 128), mx.float32, False, 1.0, "ramp"),   # value norms 1e-3 .. 1e3 within a split: fv lowered
    ((1, 1, 4, 1, 100, 128), mx.float32, False, 1e-30, 1e17),  # norms ~2^60 (squares overflow past 2^64); q ~2^-98
]


@pytest.fixture
def tensor_cores(monkeypatch):
    """The partial kernel's tensor-core loop as CUDA on sm_80+ would take it (accelerated/kernels/attention_tc.py)."""
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    katt._static.cache_clear()
    yield
    katt._static.cache_clear()


@pytest.mark.parametrize("case", TC_CASES, ids=[f"rep{c[0][2]}-L{c[0][3]}-T{c[0][4]}-d{c[0][5]}" for c in TC_CASES])
def test_tensor_core_loop_within_the_attention_budget(case, tensor_cores):
    """turboquant b4 keys and values through the tensor-core loop (float16 hi + lo operand parts, power-of-two
    scales), emulated, against float64 within conformance's attention budget."""
    _check_tc_case(case, emulate)


_REAL_MMA = katt._mma_available


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("case", TC_CASES, ids=[f"rep{c[0][2]}-L{c[0][3]}-T{c[0][4]}-d{c[0][5]}" for c in TC_CASES])
def test_tensor_core_loop_on_the_gpu_within_the_attention_budget(case):
    """The same cases through the compiled kernel (the hardware's mma accumulation, not the emulation's)."""
    _check_tc_case(case, lambda q, k, v, scale, mask: np.array(katt.attention(q, k, v, scale, mask).astype(mx.float32)))


def _check_tc_case(case, run, methods=(("turboquant", dict(bits=4)), ("turboquant", dict(bits=4))), window=0, tc=True,
                   xdtypes=(mx.float16, mx.float32), kscale=1.0):
    """`xdtypes`: the keys' and values' input dtypes (an mlx_affine record's scales and biases are in it); `kscale`:
    the keys' magnitude."""
    from veloxquant.conformance.attention_checks import attention_budget, attention_f64
    (b, hkv, rep, lq, t, d), qdt, causal, qs, vs = case
    rng = np.random.default_rng(t + d)
    (km, kkw), (vm, vkw) = methods
    kp = spec.Params(km, role="k", window=window, seed=3, layer=1, **kkw).resolved()
    vp = spec.Params(vm, role="v", window=window, seed=3, layer=1, **vkw).resolved()
    kx = mx.array((rng.standard_normal((b, hkv, t, d)) * kscale).astype(np.float32)).astype(xdtypes[0])
    vscale = np.logspace(-3, 3, t)[None, None, :, None] if vs == "ramp" else vs
    vx = mx.array((rng.standard_normal((b, hkv, t, d)) * vscale).astype(np.float32)).astype(xdtypes[1])
    q = mx.array((rng.standard_normal((b, hkv * rep, lq, d)) * qs).astype(np.float32)).astype(qdt)
    k, v = _packed(kx, kp), _packed(vx, vp)
    scale = 1.0 / np.sqrt(d)
    mask = "causal" if causal else None
    plan = katt.launch_plan(q, k, v, scale, mask)
    assert plan.key[4] == tc, f"launch_plan({methods}, d={d}) did not take the tensor-core loop {tc}: {plan.key}"
    got = run(q, k, v, scale, mask).astype(np.float64)
    qf = np.array(q.astype(mx.float32)).astype(np.float64)
    k64, v64 = np.array(k.dequantized()).astype(np.float64), np.array(v.dequantized()).astype(np.float64)
    want, p, kr, vr = attention_f64(qf, k64, v64, scale, mask)      # conformance's oracle, GQA heads repeated
    # mlx_affine: not rotated; float32 records' decode may skip the rounding of c s (GROUP_DECODE)
    budget = attention_budget(qf, kr, vr, p, scale, km != "mlx_affine", vm != "mlx_affine",
                              _affine_zero(k, t), _affine_zero(v, t))
    if qdt != mx.float32:       # the output is rounded to the queries' dtype
        budget = budget + np.abs(want) * (2.0 ** -11 if qdt == mx.float16 else 2.0 ** -8)
    ratio = np.abs(got - want) / budget
    # float32 outputs: the split operands keep ~22 bits, far inside the budget; float16 operands alone (no lo
    # parts) measured 0.066 of it on the first case, so this bound tells the two apart
    bound = TC_SPLIT_FRACTION if qdt == mx.float32 else 1.0
    assert ratio.max() <= bound, (f"tensor-core loop, case {case}: worst error / budget {ratio.max():.3g} > "
                                  f"{bound} at {np.unravel_index(ratio.argmax(), ratio.shape)}")


def _affine_zero(r, t):
    """|Bi| per decoded coordinate of a float32 mlx_affine record (attention_checks.group_zero_magnitude), else None."""
    from veloxquant.conformance.attention_checks import group_zero_magnitude
    if r.params.method != "mlx_affine" or r.fields["scales"].dtype != mx.float32:
        return None
    return group_zero_magnitude({"biases": np.array(r.fields["biases"])}, r.params, t)


@pytest.mark.parametrize("case,window", [(TC_CASES[0], 32), (TC_CASES[1], 5), (TC_CASES[3], 1)],
                         ids=["R32", "R5-causal", "R1-bf16"])
def test_tensor_core_loop_with_a_window_within_the_attention_budget(case, window, tensor_cores):
    """An exact window beside turboquant b4 records: its split in the tensor-core kernel (csrc/tc_window.h, scalar
    arithmetic over the exact tokens) within the same bounds as the records' tensor-core loop."""
    _check_tc_case(case, emulate, window=window)


TC_CODE_CASES = [
    # key method, value method, (B, Hkv, rep, L, T, d), queries dtype, causal, query scale, value scale
    (("rabitq", {}), ("rabitq", {}), ((1, 2, 4, 1, 300, 128), mx.float32, False, 2.0, 1.0)),
    (("turboquant", dict(bits=2)), ("rabitq", {}), ((1, 1, 2, 2, 75, 128), mx.bfloat16, True, 2.0, "ramp")),
    (("turboquant", dict(bits=4)), ("turboquant", dict(bits=2)), ((2, 1, 4, 1, 140, 64), mx.float16, False, 1.0, 1.0)),
    (("rabitq", {}), ("turboquant", dict(bits=1)), ((1, 2, 4, 1, 530, 128), mx.float32, False, 1e-3, 3e4)),
    (("turboquant", dict(bits=2)), ("rabitq", {}), ((1, 1, 4, 1, 90, 64), mx.float32, False, 1.0, 1.0)),
]


@pytest.mark.parametrize("case", TC_CODE_CASES, ids=[f"{c[0][0]}{c[0][1].get('bits', '')}-{c[1][0]}{c[1][1].get('bits', '')}"
                                                     f"-d{c[2][0][5]}" for c in TC_CODE_CASES])
def test_tensor_core_loop_for_other_codes_within_the_attention_budget(case, tensor_cores, monkeypatch, tune):
    """tuning's tc_codes: rabitq (1-bit signs times (n s_d) / ip) and 1- or 2-bit turboquant codes in the
    tensor-core loop (code words split per lane by the code width; a lane group's value codes within one word at
    d = 64 / 128), emulated, within the same bounds as turboquant b4's; off, these take the scalar loop."""
    tune(tc_codes=False)
    (km, kkw), (vm, vkw), c = case
    (b, hkv, rep, lq, t, d) = c[0]
    kp = spec.Params(km, role="k", window=0, seed=3, layer=1, **kkw).resolved()
    vp = spec.Params(vm, role="v", window=0, seed=3, layer=1, **vkw).resolved()
    assert not katt._tensor_cores(kp, vp, d, False, tuning.current().tc_codes), "tc_codes off: the scalar loop"
    tune(tc_codes=True)
    _check_tc_case(c, emulate, ((km, kkw), (vm, vkw)))


TC3_CASES = [
    # as TC_CODE_CASES: a role of 3-bit turboquant codes (tuning's tc_3bit)
    (("turboquant", dict(bits=3)), ("turboquant", dict(bits=3)), ((1, 2, 4, 1, 300, 128), mx.float32, False, 2.0, 1.0)),
    (("turboquant", dict(bits=3)), ("turboquant", dict(bits=2)), ((2, 1, 4, 1, 140, 128), mx.float32, False, 1e-3, 3e4)),
    (("turboquant", dict(bits=4)), ("turboquant", dict(bits=3)), ((1, 2, 4, 1, 530, 128), mx.float32, False, 1.0, 1.0)),
    (("turboquant", dict(bits=3)), ("rabitq", {}), ((1, 1, 4, 1, 100, 128), mx.float32, False, 1.0, 1.0)),
    (("rabitq", {}), ("turboquant", dict(bits=3)), ((1, 2, 2, 1, 90, 128), mx.float32, False, 1.0, 1.0)),
    (("turboquant", dict(bits=3)), ("turboquant", dict(bits=3)), ((1, 1, 2, 2, 75, 128), mx.bfloat16, True, 2.0, "ramp")),
    (("turboquant", dict(bits=3)), ("turboquant", dict(bits=3)), ((1, 1, 2, 2, 75, 64), mx.float16, True, 2.0, 1.0)),
    (("turboquant", dict(bits=3)), ("turboquant", dict(bits=4)), ((2, 1, 4, 1, 140, 64), mx.float32, False, 1.0, 1.0)),
    (("turboquant", dict(bits=2)), ("turboquant", dict(bits=3)), ((1, 2, 4, 1, 90, 64), mx.float32, False, 1.0, "ramp")),
]
TC3_IDS = [f"{c[0][0]}{c[0][1].get('bits', '')}-{c[1][0]}{c[1][1].get('bits', '')}-d{c[2][0][5]}-{c[2][1]}"
           .replace("turboquant", "tq").replace("mlx.core.", "") for c in TC3_CASES]


@pytest.mark.parametrize("case", TC3_CASES, ids=TC3_IDS)
def test_tensor_core_loop_for_3bit_codes_within_the_attention_budget(case, tensor_cores, tune):
    """tuning's tc_3bit: 3-bit turboquant codes (10 to a word, a lane's codes from an offset inside its first word:
    loaded raw, realigned per use, csrc/tc_tens_*.cuh) in either role beside 1-, 2-, 3- or 4-bit turboquant or rabitq
    codes in the other, emulated, within the same bounds as turboquant b4's; off, they take the scalar loop."""
    (km, kkw), (vm, vkw), c = case
    d = c[0][5]
    kp = spec.Params(km, role="k", window=0, seed=3, layer=1, **kkw).resolved()
    vp = spec.Params(vm, role="v", window=0, seed=3, layer=1, **vkw).resolved()
    tune(tc_3bit=False)
    assert not katt._tensor_cores(kp, vp, d, False, True, True, tuning.current().tc_3bit), "tc_3bit off: the scalar loop"
    tune(tc_3bit=True)
    _check_tc_case(c, emulate, ((km, kkw), (vm, vkw)), tc=src.TC_TENS)


@pytest.mark.parametrize("case,window", [(TC3_CASES[0], 32), (TC3_CASES[6], 5)], ids=["tq3-R32", "tq3-d64-R5-causal"])
def test_tensor_core_loop_for_3bit_codes_with_a_window(case, window, tensor_cores, tune):
    """3-bit records beside an exact window (its split in scalar arithmetic, csrc/tc_window.h) in the same bounds."""
    (km, kkw), (vm, vkw), c = case
    tune(tc_3bit=True)
    _check_tc_case(c, emulate, ((km, kkw), (vm, vkw)), window=window, tc=src.TC_TENS)


TC_KIVI_CASES = [
    # key kw, value kw (one group size: a KIVI cache's roles flush together), window, tokens per split, (case as
    # TC_CASES')
    (dict(bits=2, group_size=32), dict(bits=2, group_size=32), 0, 40,
     ((1, 2, 4, 1, 300, 128), mx.float32, False, 2.0, 1.0)),
    (dict(bits=4, group_size=16), dict(bits=4, group_size=16), 16, 256,
     ((1, 1, 2, 2, 75, 64), mx.float16, True, 2.0, 1.0)),
    (dict(bits=1, group_size=64), dict(bits=1, group_size=64), 0, 100,
     ((2, 1, 4, 1, 260, 128), mx.float32, False, 1e-3, 300.0)),
    (dict(bits=2, group_size=128), dict(bits=4, group_size=128), 5, 50,
     ((1, 2, 4, 1, 600, 128), mx.float32, False, 1.0, "ramp")),
    (dict(bits=2, group_size=16), dict(bits=2, group_size=16), 0, 256,
     ((1, 1, 4, 1, 530, 128), mx.bfloat16, False, 40.0, 1e-3)),
]


TC_KIVI_IDS = [f"k{c[0]['bits']}g{c[0]['group_size']}-v{c[1]['bits']}g{c[1]['group_size']}-w{c[2]}-d{c[4][0][5]}"
               for c in TC_KIVI_CASES]


def _kpairs_taken(case, pairs: bool) -> None:
    """The launch's KP (chunks a warp takes in a row, tuning's tc_kpairs): 2 where the knob is on and the key group
    holds two chunks (G >= 32), else 1."""
    kkw, vkw, window, _, c = case
    (b, hkv, rep, lq, t, d), qdt = c[0], c[1]
    kp = spec.Params("kivi", role="k", window=window, seed=3, layer=1, **kkw).resolved()
    vp = spec.Params("kivi", role="v", window=window, seed=3, layer=1, **vkw).resolved()
    q = mx.zeros((b, hkv * rep, lq, d), dtype=qdt)
    plan = katt.launch_plan(q, _packed(mx.zeros((b, hkv, t, d)), kp), _packed(mx.zeros((b, hkv, t, d)), vp),
                            d ** -0.5, None)
    want = 2 if pairs and kkw["group_size"] >= 32 else 1
    assert dict(plan.partial_template)["KP"] == want, f"tc_kpairs={pairs}, G={kkw['group_size']}: KP != {want}"


@pytest.mark.parametrize("pairs", [False, True], ids=["one", "kpairs"])
@pytest.mark.parametrize("case", TC_KIVI_CASES, ids=TC_KIVI_IDS)
def test_tensor_core_loop_for_kivi_within_the_attention_budget(case, pairs, tensor_cores, tune):
    """tuning's tc_kivi: KIVI keys (the query times a group's channel scales as the A operand, the codes exact in
    B, q . z per group) and values (s code + z dequantized into A) in the tensor-core loop, emulated, within the
    same bounds as turboquant b4's; splits of tokens_per_split tokens start off a 16-token boundary (the loop's
    chunks start rounded down, the tokens below masked); off, KIVI takes the scalar loop. `pairs` (tc_kpairs): a
    warp takes two chunks of one key group in a row, the splits' chunks from 32-token boundaries."""
    kkw, vkw, window, per_split, c = case
    d = c[0][5]
    tune(tc_kivi=False, tokens_per_split=per_split)
    kp = spec.Params("kivi", role="k", window=window, seed=3, layer=1, **kkw).resolved()
    vp = spec.Params("kivi", role="v", window=window, seed=3, layer=1, **vkw).resolved()
    assert not katt._tensor_cores(kp, vp, d, bool(window), tuning.current().tc_codes, tuning.current().tc_kivi)
    tune(tc_kivi=True, tc_kpairs=pairs)
    _kpairs_taken(case, pairs)
    _check_tc_case(c, emulate, (("kivi", kkw), ("kivi", vkw)), window=window)


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("pairs", [False, True], ids=["one", "kpairs"])
@pytest.mark.parametrize("case", TC_KIVI_CASES, ids=TC_KIVI_IDS)
def test_tensor_core_loop_for_kivi_on_the_gpu(case, pairs, tune):
    """The tc_kivi cases through the compiled kernel (the hardware's mma accumulation), tc_kpairs off and on."""
    kkw, vkw, window, per_split, c = case
    tune(tc_kivi=True, tokens_per_split=per_split, tc_kpairs=pairs)
    _kpairs_taken(case, pairs)
    katt._static.cache_clear()
    _check_tc_case(c, lambda q, k, v, scale, mask: np.array(katt.attention(q, k, v, scale, mask).astype(mx.float32)),
                   (("kivi", kkw), ("kivi", vkw)), window=window)


TC_AFFINE_CASES = [
    # key kw, value kw, window, (keys', values' input dtype[, keys' magnitude: far outside float16's normal range, so
    # that the chunks' powers of two must bring them into it]), (case as TC_CASES')
    (dict(bits=4, group_size=64), dict(bits=4, group_size=64), 0, (mx.float32, mx.float32, 1e-7),
     ((1, 2, 4, 1, 300, 128), mx.float32, False, 2e7, 1.0)),
    (dict(bits=2, group_size=32), dict(bits=2, group_size=32), 0, (mx.float16, mx.float32),
     ((2, 1, 4, 1, 260, 128), mx.float32, False, 1e-3, 300.0)),
    (dict(bits=4, group_size=32), dict(bits=2, group_size=64), 0, (mx.float16, mx.float16),
     ((1, 1, 2, 2, 75, 64), mx.float16, True, 2.0, 1.0)),
    (dict(bits=4, group_size=128), dict(bits=2, group_size=64), 0, (mx.bfloat16, mx.bfloat16, 3e5),
     ((1, 1, 4, 2, 530, 128), mx.bfloat16, True, 1e-5, 1e-3)),
    (dict(bits=8, group_size=32), dict(bits=8, group_size=128), 0, (mx.float16, mx.float32),
     ((1, 2, 4, 1, 600, 128), mx.float32, False, 1.0, "ramp")),
    (dict(bits=4, group_size=32), dict(bits=4, group_size=32), 5, (mx.float32, mx.float16),
     ((1, 1, 2, 2, 75, 64), mx.float32, True, 2.0, 1.0)),
    (dict(bits=8, group_size=64), dict(bits=8, group_size=32), 0, (mx.bfloat16, mx.float32),
     ((2, 1, 1, 1, 140, 64), mx.float16, False, 1.0, 1.0)),       # one query row; 8-bit value words whole at d = 64
]
TC_AFFINE_IDS = [f"k{c[0]['bits']}g{c[0]['group_size']}-v{c[1]['bits']}g{c[1]['group_size']}-w{c[2]}"
                 f"-{str(c[3][0]).split('.')[-1]}-d{c[4][0][5]}" for c in TC_AFFINE_CASES]


@pytest.mark.parametrize("case", TC_AFFINE_CASES, ids=TC_AFFINE_IDS)
def test_tensor_core_loop_for_mlx_affine_within_the_attention_budget(case, tensor_cores, tune):
    """tuning's tc_affine: mlx_affine keys (T(T(c s) + b) times a power of two per chunk in B) and values (the same
    in A) in the tensor-core loop, float32 records as hi + lo parts, emulated, within the same bounds as turboquant
    b4's; off, mlx_affine takes the scalar loop."""
    kkw, vkw, window, xdt, c = case
    d = c[0][5]
    tune(tc_affine=False)
    kp = spec.Params("mlx_affine", role="k", window=window, seed=3, layer=1, **kkw).resolved()
    vp = spec.Params("mlx_affine", role="v", window=window, seed=3, layer=1, **vkw).resolved()
    t = tuning.current()
    assert not katt._tensor_cores(kp, vp, d, bool(window), t.tc_codes, t.tc_kivi, t.tc_affine), "off: the scalar loop"
    tune(tc_affine=True)
    _check_tc_case(c, emulate, (("mlx_affine", kkw), ("mlx_affine", vkw)), window=window, xdtypes=xdt[:2],
                   kscale=(xdt + (1.0,))[2])


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("case", TC_AFFINE_CASES, ids=TC_AFFINE_IDS)
def test_tensor_core_loop_for_mlx_affine_on_the_gpu(case, tune):
    """The tc_affine cases through the compiled kernel (the hardware's mma accumulation and NVRTC's contraction of
    a float32 record's c s + b: the GROUP_DECODE term)."""
    kkw, vkw, window, xdt, c = case
    tune(tc_affine=True)
    katt._static.cache_clear()
    _check_tc_case(c, lambda q, k, v, scale, mask: np.array(katt.attention(q, k, v, scale, mask).astype(mx.float32)),
                   (("mlx_affine", kkw), ("mlx_affine", vkw)), window=window, xdtypes=xdt[:2],
                   kscale=(xdt + (1.0,))[2])


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("case", TC_CODE_CASES, ids=[f"{c[0][0]}{c[0][1].get('bits', '')}-{c[1][0]}{c[1][1].get('bits', '')}"
                                                     f"-d{c[2][0][5]}" for c in TC_CODE_CASES])
def test_tensor_core_loop_for_other_codes_on_the_gpu(case, monkeypatch, tune):
    """The tc_codes cases through the compiled kernel (the hardware's mma accumulation)."""
    tune(tc_codes=True)
    (km, kkw), (vm, vkw), c = case
    _check_tc_case(c, lambda q, k, v, scale, mask: np.array(katt.attention(q, k, v, scale, mask).astype(mx.float32)),
                   ((km, kkw), (vm, vkw)))


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("case", TC3_CASES, ids=TC3_IDS)
def test_tensor_core_loop_for_3bit_codes_on_the_gpu(case, tune):
    """The tc_3bit cases through the compiled kernel (NVRTC's text, the hardware's mma accumulation)."""
    tune(tc_3bit=True)
    katt._static.cache_clear()
    (km, kkw), (vm, vkw), c = case
    _check_tc_case(c, lambda q, k, v, scale, mask: np.array(katt.attention(q, k, v, scale, mask).astype(mx.float32)),
                   ((km, kkw), (vm, vkw)), tc=src.TC_TENS)


APPEND_CASES = [
    # key method/kw, value method/kw, (B, Hkv, rep, L = t new tokens, T, d), x dtype, tensor cores, causal
    (("turboquant", dict(bits=4)), ("turboquant", dict(bits=4)), (1, 2, 4, 1, 70, 128), mx.float16, True, False),
    (("turboquant_rvq", dict(bits=3, bits2=2)), ("turboquant_prod", dict(bits=3)), (2, 2, 2, 1, 40, 64),
     mx.bfloat16, False, False),
    (("rabitq", {}), ("mlx_affine", dict(bits=4, group_size=32)), (1, 2, 2, 3, 30, 64), mx.float16, False, True),
    (("mlx_affine", dict(bits=4, group_size=64)), ("mlx_affine", dict(bits=2, group_size=32)), (1, 2, 4, 1, 70, 128),
     mx.float16, True, False),
    (("turboquant", dict(bits=3)), ("turboquant", dict(bits=2)), (1, 2, 4, 1, 70, 128), mx.float16, True, False),
    (("turboquant", dict(bits=3)), ("rabitq", {}), (2, 2, 2, 2, 40, 64), mx.bfloat16, True, True),
]


@pytest.mark.parametrize("case", APPEND_CASES, ids=[f"{c[0][0]}{'3' * (c[0] == ('turboquant', dict(bits=3)))}-{c[1][0]}"
                                                   f"-tc{int(c[4])}" for c in APPEND_CASES])
def test_append_inside_the_partial_stores_the_append_bytes_and_attends_over_them(case, monkeypatch, tune):
    """APPEND (attention_source.append_block): split S - 1 encodes the last t tokens' keys and values into their rows
    of the buffers (poisoned with all ones first): the bytes of accelerated.ops' encode, bit for bit, every token
    checked (a clean token); the attention over all T tokens within the float64 budget; a NaN in one KV head's new
    key shows in that head's token slot only, and nothing is written past the encoded rows."""
    tune(tokens_per_split=8, tc_3bit=True)
    monkeypatch.setattr(katt, "_mma_available", lambda: case[4])
    katt._static.cache_clear()
    try:
        (km, kkw), (vm, vkw), (b, hkv, rep, lq, t, d), xdt, tc, causal = case
        rng = np.random.default_rng(t + d)
        kp = spec.Params(km, role="k", window=0, seed=4, layer=1, head_offset=2, **kkw).resolved()
        vp = spec.Params(vm, role="v", window=0, seed=4, layer=1, head_offset=2, **vkw).resolved()
        kx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(xdt)
        vx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(xdt)
        q = mx.array(rng.standard_normal((b, hkv * rep, lq, d)).astype(np.float32)).astype(mx.float16)
        k, v = _packed(kx, kp), _packed(vx, vp)
        scale = 1.0 / np.sqrt(d)
        mask = "causal" if causal else None
        new = (kx[:, :, t - lq:], vx[:, :, t - lq:], kp, vp, True)
        got, rows, token, summary = emulate(q, k, v, scale, mask, append=new)
        plan = katt.launch_plan(q, k, v, scale, mask)
        assert bool(plan.key[4]) == tc, f"tensor-core loop {plan.key[4]}, case expects {tc}"
        assert not token.any(), f"a clean chunk reported faults: {token.tolist()}"
        assert not summary.any(), f"the combine's summary of a clean token: {summary.tolist()}"
        for rec in (k, v):
            role = "k" if rec is k else "v"
            for kn, name in katt._field_names(rec.params.method, role):
                want = _strided(rec.fields[name], 0)
                assert np.array_equal(rows[kn].view(np.uint8), want.view(np.uint8)), \
                    f"{rec.params.method} {role} {name}: the appended rows differ from accelerated.ops' encode"
        want = f64_attention(np.array(q.astype(mx.float32)), np.array(k.dequantized()), np.array(v.dequantized()),
                             scale, causal)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max(), err_msg="APPEND vs float64")
        # a NaN in head 1's new key: the keys' NaN/Inf slot of group (batch 0, head 1) only
        bad = np.array(kx.astype(mx.float32))
        bad[0, 1, t - 1, 5] = np.nan
        bad = mx.array(bad).astype(xdt)
        _, _, token, summary = emulate(q, k, v, scale, mask, append=(bad[:, :, t - lq:], new[1], kp, vp, False))
        want_tok = np.zeros_like(token)
        want_tok[0, 1, 0] = True
        assert np.array_equal(token, want_tok), f"token after a NaN key in head 1: {token.tolist()}"
        # the host reads only the combine's summary: the keys' NaN/Inf check over all groups, nothing else
        assert summary.tolist() == [[[True, False]], [[False, False]]], f"summary of that token: {summary.tolist()}"
    finally:
        katt._static.cache_clear()


WINDOW_CASES = [
    # key method/kw, value method/kw, (B, Hkv, rep, L = t new tokens, T, d, R), x dtype, causal, tensor cores
    (("turboquant", dict(bits=4)), ("turboquant", dict(bits=4)), (1, 2, 4, 1, 70, 128, 32), mx.float16, False, True),
    (("turboquant", dict(bits=4)), ("turboquant", dict(bits=4)), (1, 1, 2, 2, 50, 64, 3), mx.float32, True, True),
    (("turboquant_rvq", dict(bits=3, bits2=2)), ("turboquant_prod", dict(bits=3)), (2, 2, 2, 1, 40, 64, 5),
     mx.bfloat16, False, False),
    (("rabitq", {}), ("mlx_affine", dict(bits=4, group_size=32)), (1, 2, 2, 3, 30, 64, 3), mx.float16, True, False),
    (("mlx_affine", dict(bits=4, group_size=32)), ("rabitq", {}), (1, 1, 3, 1, 20, 64, 1), mx.float32, False, False),
    (("mlx_affine", dict(bits=4, group_size=32)), ("mlx_affine", dict(bits=8, group_size=64)), (1, 1, 2, 2, 50, 64, 3),
     mx.bfloat16, True, True),
    (("turboquant", dict(bits=4)), ("turboquant", dict(bits=3)), (1, 2, 4, 1, 70, 128, 32), mx.float16, False, True),
]


KIVI_CASES = [
    # (B, Hkv, rep, T, d), R, G, x dtype, causal, whether the step flushes a group
    ((1, 2, 2, 5 + 16 + 16, 64), 5, 16, mx.float16, False, True),
    ((2, 1, 3, 5 + 16 + 7, 64), 5, 16, mx.float16, True, False),
    ((1, 2, 2, 32 + 5 + 1, 128), 5, 16, mx.bfloat16, False, False),
    ((1, 2, 2, 32, 64), 0, 16, mx.float16, False, True),       # R = 0: the flush encodes the chunk's own token
    ((2, 1, 2, 16 + 7, 64), 0, 16, mx.bfloat16, True, False),
    ((1, 1, 4, 32 + 3 + 16, 64), 3, 16, mx.float32, False, True),
]


@pytest.mark.parametrize("case", KIVI_CASES, ids=[f"T{c[0][3]}-R{c[1]}-G{c[2]}-flush{int(c[5])}" for c in KIVI_CASES])
def test_append_inside_the_partial_moves_kivi_windows(case, monkeypatch, tune, tc=False):
    """KIVI with an exact window (its window holds R .. R + G - 1 tokens): the decode step's launch copies the token
    into the window (poisoned first), which the window split attends from the chunk; at a flush (the window reached
    R + G) split S - 1 also encodes the G tokens leaving it (kf / vf) into their rows of the records (poisoned first:
    keys' codes rows and their one scale / zero row, values' rows) and attends them. Records and window after the
    launch are one-shot encode's of all T tokens, bit for bit; the output within the float64 budget."""
    tune(tokens_per_split=8)
    monkeypatch.setattr(katt, "_mma_available", lambda: tc)
    katt._static.cache_clear()
    try:
        (b, hkv, rep, t, d), r, g, xdt, causal, flush = case
        rng = np.random.default_rng(t + d + r + g)
        kp = spec.Params("kivi", role="k", window=r, seed=4, layer=1, bits=2, group_size=g).resolved()
        vp = spec.Params("kivi", role="v", window=r, seed=4, layer=1, bits=2, group_size=g).resolved()
        assert katt._tensor_cores(kp, vp, d, bool(r), True, tuning.current().tc_kivi) == tc, "the loop the case is for"
        kx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(xdt)
        vx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(xdt)
        q = mx.array(rng.standard_normal((b, hkv * rep, 1, d)).astype(np.float32)).astype(mx.float16)
        k, v = ref_k, ref_v = _packed(kx, kp), _packed(vx, vp)
        qe = k.encoded
        assert (k.window.shape[2] == r) == flush and qe % g == 0 and qe > 0, "the case's state after the step"
        scale = 1.0 / np.sqrt(d)
        mask = "causal" if causal else None
        nq = g if flush else 0
        own = int(flush and r == 0)
        if own:     # the launch's window is the chunk's row it writes (stream.InPlace.windows); the record's is empty
            k, v = (oatt.PackedRecord(p, rec.fields, x[:, :, t - 1:], qe, rec.decode_tokens)
                    for p, rec, x in ((kp, k, kx), (vp, v, vx)))
        leaving = (kx[:, :, qe - g:qe], vx[:, :, qe - g:qe]) if flush else (kx[:, :, t - 1:], vx[:, :, t - 1:])
        new = (kx[:, :, t - 1:], vx[:, :, t - 1:], kp, vp, True, leaving, nq, own)
        # blocks in both orders: the window split before the append's (it must read the new token from the chunk),
        # and the record splits before it (they must not read the group it encodes: split S - 1 attends it)
        got, rows, token, summary = emulate(q, k, v, scale, mask, append=new, reverse=True)
        forward = emulate(q, k, v, scale, mask, append=new)[0]
        assert np.array_equal(forward, got), "the output depends on the order of the launch's blocks"
        assert not token.any() and not summary.any(), (token.tolist(), summary.tolist())
        for rec, role in ((k, "k"), (v, "v")):
            for kn, name in katt._field_names(rec.params.method, role):
                want = _strided(rec.fields[name], 0)
                got_rows = rows[kn][:, :, :want.shape[2]]
                assert np.array_equal(got_rows.view(np.uint8), want.view(np.uint8)), \
                    f"kivi {role} {name}: the records after the launch differ from one-shot encode (flush {flush})"
            assert np.array_equal(rows[f"{role}w"].view(np.uint8), _strided(rec.window, 0).view(np.uint8)), \
                f"{role}: the window after the launch differs from one-shot encode's (own: the chunk's row)"
        want = f64_attention(np.array(q.astype(mx.float32)), np.array(ref_k.dequantized()),
                             np.array(ref_v.dequantized()), scale, causal)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max(), err_msg="KIVI window vs f64")
    finally:
        katt._static.cache_clear()


MIXED_CASES = [
    # keys (method, kw, R), values (method, kw, R), (B, Hkv, rep, T, d), x dtype, causal: T after the step
    (("turboquant", dict(bits=3), 0), ("kivi", dict(bits=2, group_size=32), 128), (1, 2, 2, 128 + 64, 64),
     mx.float16, False),                                     # the values flush a group (window back at R)
    (("turboquant", dict(bits=3), 0), ("kivi", dict(bits=2, group_size=32), 128), (1, 2, 2, 128 + 64 + 7, 64),
     mx.float16, False),
    (("turboquant", dict(bits=3), 0), ("kivi", dict(bits=2, group_size=32), 32), (2, 1, 3, 32 + 64, 64),
     mx.bfloat16, True),
    (("turboquant", dict(bits=3), 0), ("kivi", dict(bits=2, group_size=32), 32), (1, 2, 2, 32 + 64 + 9, 128),
     mx.float16, False),
    (("turboquant", dict(bits=4), 32), ("rabitq", {}, 0), (1, 2, 2, 70, 64), mx.float16, False),   # values ahead
    # both windowed (the cache's window=32): the window split reads each window from its own row
    (("turboquant", dict(bits=3), 32), ("kivi", dict(bits=2, group_size=32), 32), (1, 2, 2, 32 + 64 + 9, 64),
     mx.float16, True),
    (("turboquant", dict(bits=3), 32), ("kivi", dict(bits=2, group_size=32), 32), (1, 2, 2, 32 + 64, 64),
     mx.float16, False),                                     # at a flush the counts meet: one launch all the same
    # KIVI with R = 0 at a flush (the group's last token the chunk's own): keys (the 5-bit pick), values
    (("kivi", dict(bits=4, group_size=64), 0), ("turboquant", dict(bits=4), 0), (1, 2, 2, 128, 128), mx.float16,
     False),
    (("turboquant", dict(bits=3), 0), ("kivi", dict(bits=2, group_size=32), 0), (1, 2, 2, 64, 64), mx.float16, False),
]


@pytest.mark.parametrize("case", [c for c in KIVI_CASES if c[5]], ids=[f"T{c[0][3]}-R{c[1]}-G{c[2]}" for c in KIVI_CASES
                                                                       if c[5]])
def test_append_inside_the_partial_moves_kivi_windows_on_the_tensor_core_loop(case, monkeypatch, tune):
    """The flush cases above through the KIVI tensor-core loop (tuning's tc_kivi): split S - 1 attends the group
    its append encodes, from the records it wrote, with the mma loop; the window split loading a warp's next token
    ahead too (tuning's tc_window_prefetch, csrc/tc_window.h's VQ_WPF: the chunk's own rows from kx / vx)."""
    tune(tc_kivi=True)
    test_append_inside_the_partial_moves_kivi_windows(case, monkeypatch, tune, tc=True)
    with monkeypatch.context() as m:
        _window_prefetch(m)
        test_append_inside_the_partial_moves_kivi_windows(case, monkeypatch, tune, tc=True)


def _window_prefetch(monkeypatch) -> None:
    """The emulated partial compiled with VQ_WPF 1 (what tuning's tc_window_prefetch puts in a CUDA launch's header)."""
    real = src.partial_body
    monkeypatch.setattr(src, "partial_body", lambda *a, **kw: "#define VQ_WPF 1\n" + real(*a, **kw))


WPF_CASES = [   # methods (keys, values), window, tokens per split, case as TC_CASES'
    ((("turboquant", dict(bits=4)), ("turboquant", dict(bits=4))), 40, 64, TC_CASES[0]),
    ((("kivi", dict(bits=4, group_size=16)), ("kivi", dict(bits=4, group_size=16))), 16, 256, TC_KIVI_CASES[1][4]),
    ((("kivi", dict(bits=2, group_size=128)), ("kivi", dict(bits=4, group_size=128))), 5, 50, TC_KIVI_CASES[3][4]),
]


@pytest.mark.parametrize("case", WPF_CASES, ids=["tq4-R40", "kivi4-g16-R16-causal", "kivi2-g128-R5"])
def test_window_prefetch_is_the_same_arithmetic(case, tensor_cores, tune, monkeypatch):
    """tuning's tc_window_prefetch (csrc/tc_window.h's VQ_WPF): the window split loads a warp's next token while it
    scores one, the same arithmetic in the same order, so the emulated launch's output is bit for bit the one
    without it (windows of several tokens per warp, a causal case, windows shorter than the warps)."""
    methods, window, per_split, c = case
    tune(tc_kivi=True, tokens_per_split=per_split)
    (b, hkv, rep, lq, t, d), qdt, causal, qs, vs = c
    rng = np.random.default_rng(t + d + window)
    (km, kkw), (vm, vkw) = methods
    kp = spec.Params(km, role="k", window=window, seed=3, layer=1, **kkw).resolved()
    vp = spec.Params(vm, role="v", window=window, seed=3, layer=1, **vkw).resolved()
    k = _packed(mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16), kp)
    v = _packed(mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16), vp)
    q = mx.array((rng.standard_normal((b, hkv * rep, lq, d)) * qs).astype(np.float32)).astype(qdt)
    mask = "causal" if causal else None
    assert katt.launch_plan(q, k, v, d ** -0.5, mask).key[4], "not the tensor-core loop"
    assert k.window.shape[2] >= window > 0, "no window"     # (KIVI's: R and the unflushed part of a group)
    plain = emulate(q, k, v, d ** -0.5, mask)
    with monkeypatch.context() as m:
        _window_prefetch(m)
        ahead = emulate(q, k, v, d ** -0.5, mask)
    assert np.array_equal(plain.view(np.uint8), ahead.view(np.uint8)), \
        f"tc_window_prefetch changed the output: worst {np.abs(plain.astype(np.float64) - ahead).max()}"


@pytest.mark.parametrize("case", MIXED_CASES, ids=[f"{c[0][0]}{c[0][1].get('bits', '')}R{c[0][2]}-{c[1][0]}R{c[1][2]}"
                                                   f"-T{c[2][3]}" for c in MIXED_CASES])
def test_mixed_roles_through_one_partial(case, monkeypatch, tune, tc=False):
    """MIXED (attention_source.MIXED_WINDOWS): keys and values of different methods or windows in one layer have
    encoded counts of their own (keys turboquant 3-bit with R = 0 and values KIVI 2-bit with R = 128 or 32, the
    recommended quality configuration; keys with a window of 32 beside rabitq values with none). The partial takes
    nenc as the common prefix and reads each role's own past it: split S - 1 attends one role's records beside the
    other's window (no decode of the cache, no concatenation), the window split both windows from their own rows.
    Without the append and with it (split S - 1 encodes each role's own rows: the keys' token, the values' group at
    a flush or none, bit for bit accelerated.ops' one-shot encode, blocks in both orders), within the float64
    budget over all T tokens. `tc`: the loop the case takes, tuning's tc_mixed (tests/test_tc_mixed_emulated.py) or
    tc_mixkv (TC_MIXK, tests/test_tc_mixkv_emulated.py); False: both off."""
    tune(tokens_per_split=16, tc_mixed=bool(tc), tc_mixkv=tc == src.TC_MIXK)
    monkeypatch.setattr(katt, "_mma_available", lambda: True)    # (MIXED: the scalar loop but with tuning's tc_mixed)
    katt._static.cache_clear()
    try:
        (km, kkw, kr), (vm, vkw, vr), (b, hkv, rep, t, d), xdt, causal = case
        rng = np.random.default_rng(t + d + kr + vr)
        kp = spec.Params(km, role="k", window=kr, seed=4, layer=1, head_offset=1, **kkw).resolved()
        vp = spec.Params(vm, role="v", window=vr, seed=4, layer=1, head_offset=1, **vkw).resolved()
        kx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(xdt)
        vx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(xdt)
        q = mx.array(rng.standard_normal((b, hkv * rep, 1, d)).astype(np.float32)).astype(mx.float16)
        k, v = _packed(kx, kp), _packed(vx, vp)
        assert min(k.encoded, v.encoded) > 0 and katt.mixed_windows(kp, vp) > 0, "the case must be MIXED"
        scale = 1.0 / np.sqrt(d)
        mask = "causal" if causal else None
        want = f64_attention(np.array(q.astype(mx.float32)), np.array(k.dequantized()), np.array(v.dequantized()),
                             scale, causal)
        tol = 2e-3 * np.abs(want).max()
        plan = katt.launch_plan(q, k, v, scale, mask, mixed=True)
        assert plan.key[2] in src.MIXED_WINDOWS and plan.key[4] == tc, f"not the MIXED partial's loop {tc}: {plan.key}"
        got = emulate(q, k, v, scale, mask, mixed=True)
        np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg="MIXED partial vs float64")
        # the append inside: each role's tokens leaving its window (none without one), the tokens it encodes, and
        # the chunk's own among them (KIVI with R = 0 at a flush: the launch's window is the chunk's row it writes,
        # in_place.InPlace.windows; the record's after the step is empty)
        leaving, nq, own, recs = [], [], [], []
        for x, p, rec in ((kx, kp, k), (vx, vp, v)):
            qe = rec.encoded
            if p.method == "kivi":
                flush = rec.window.shape[2] == p.window
                nq.append(p.group_size if flush else 0)
                leaving.append(x[:, :, qe - p.group_size:qe] if flush else x[:, :, t - 1:])
                own.append(int(flush and p.window == 0))
            else:
                nq.append(1)
                leaving.append(x[:, :, qe - 1:qe] if p.window else None)
                own.append(0)
            recs.append(oatt.PackedRecord(p, rec.fields, x[:, :, t - 1:], qe, rec.decode_tokens) if own[-1] else rec)
        k, v = recs
        new = (kx[:, :, t - 1:], vx[:, :, t - 1:], kp, vp, True, tuple(leaving), tuple(nq), tuple(own))
        got, rows, token, summary = emulate(q, k, v, scale, mask, append=new, reverse=True, mixed=True)
        forward = emulate(q, k, v, scale, mask, append=new, mixed=True)[0]
        assert np.array_equal(forward, got), "the output depends on the order of the launch's blocks"
        assert not token.any() and not summary.any(), (token.tolist(), summary.tolist())
        for rec, role, x in ((k, "k", leaving[0]), (v, "v", leaving[1])):
            for kn, name in katt._field_names(rec.params.method, role):
                want_rows = _strided(rec.fields[name], 0)
                assert np.array_equal(rows[kn][:, :, :want_rows.shape[2]].view(np.uint8), want_rows.view(np.uint8)), \
                    f"{rec.params.method} {role} {name}: the rows after the launch differ from one-shot encode"
            if x is not None:
                assert np.array_equal(rows[f"{role}w"].view(np.uint8), _strided(rec.window, 0).view(np.uint8)), \
                    f"{role}: the window after the launch differs from one-shot encode's"
        np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg="MIXED partial with the append vs float64")
    finally:
        katt._static.cache_clear()


@pytest.mark.parametrize("case", WINDOW_CASES, ids=[f"{c[0][0]}-{c[1][0]}{'3' * (c[1] == ('turboquant', dict(bits=3)))}"
                                                   f"-R{c[2][6]}-tc{int(c[5])}" for c in WINDOW_CASES])
def test_append_inside_the_partial_moves_exact_windows(case, monkeypatch, tune):
    """APPEND with exact windows (kernels/append.py WINDOWED): split S - 1 encodes the t tokens leaving each window
    into their rows of the records (poisoned first: the bytes of accelerated.ops' one-shot encode of all T tokens)
    and copies the chunk into the window's last t rows (poisoned first), which the window split of the same launch
    attends (reading them from the chunk); the window after the launch is one-shot encode's, the output within the
    float64 budget over all T tokens, a NaN in the values' chunk in that head's slot only."""
    tune(tokens_per_split=8, tc_3bit=True)
    monkeypatch.setattr(katt, "_mma_available", lambda: case[5])
    katt._static.cache_clear()
    try:
        (km, kkw), (vm, vkw), (b, hkv, rep, lq, t, d, r), xdt, causal, tc = case
        rng = np.random.default_rng(t + d + r)
        kp = spec.Params(km, role="k", window=r, seed=4, layer=1, head_offset=2, **kkw).resolved()
        vp = spec.Params(vm, role="v", window=r, seed=4, layer=1, head_offset=2, **vkw).resolved()
        kx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(xdt)
        vx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(xdt)
        q = mx.array(rng.standard_normal((b, hkv * rep, lq, d)).astype(np.float32)).astype(mx.float16)
        k, v = _packed(kx, kp), _packed(vx, vp)
        qe = t - r
        scale = 1.0 / np.sqrt(d)
        mask = "causal" if causal else None
        leaving = (kx[:, :, qe - lq:qe], vx[:, :, qe - lq:qe])
        new = (kx[:, :, t - lq:], vx[:, :, t - lq:], kp, vp, True, leaving)
        # the window split first: the rows the append writes are still poisoned when it runs
        got, rows, token, summary = emulate(q, k, v, scale, mask, append=new, reverse=True)
        assert bool(katt.launch_plan(q, k, v, scale, mask).key[4]) == tc, "tensor-core loop: not as the case expects"
        assert not token.any() and not summary.any(), (token.tolist(), summary.tolist())
        for rec, role in ((k, "k"), (v, "v")):
            for kn, name in katt._field_names(rec.params.method, role):
                want = _strided(rec.fields[name], 0)
                assert np.array_equal(rows[kn].view(np.uint8), want.view(np.uint8)), \
                    f"{rec.params.method} {role} {name}: the appended rows differ from accelerated.ops' encode"
            assert np.array_equal(rows[f"{role}w"].view(np.uint8), _strided(rec.window, 0).view(np.uint8)), \
                f"{role}: the window after the launch differs from one-shot encode's"
        want = f64_attention(np.array(q.astype(mx.float32)), np.array(k.dequantized()), np.array(v.dequantized()),
                             scale, causal)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max(), err_msg="APPEND window vs f64")
        bad = np.array(vx.astype(mx.float32))
        bad[0, hkv - 1, t - 1, 3] = np.nan
        bad = mx.array(bad).astype(xdt)
        _, _, token, summary = emulate(q, k, v, scale, mask, append=(new[0], bad[:, :, t - lq:], kp, vp, False, leaving))
        want_tok = np.zeros_like(token)
        want_tok[1, hkv - 1, 0] = True
        assert np.array_equal(token, want_tok), f"token after a NaN value in head {hkv - 1}: {token.tolist()}"
    finally:
        katt._static.cache_clear()


@pytest.mark.parametrize("tc", [True, False], ids=["tensor-cores", "scalar"])
def test_append_inside_with_row_starts(tc, monkeypatch, tune):
    """The B-row batch's decode step on CUDA (accelerated/cache/batch_shared.py): APPEND and row starts in one
    launch. Split S - 1 stores every row's new token (the bytes of accelerated.ops' encode), splits 0 .. S - 2 cover
    each row's tokens from its start; the output per row against float64 over that row's own tokens, with the rows
    below the starts as stored and with all their bits set (the scalar loop gives a poisoned token no weight, so
    only the first run would show one attended there)."""
    tune(tokens_per_split=8)
    monkeypatch.setattr(katt, "_mma_available", lambda: tc)
    monkeypatch.setattr(katt, "_sm_count", lambda: 4)
    katt._static.cache_clear()
    try:
        starts = [0, 23, 60, 79]          # the last row's only real token is the appended one
        b, hkv, rep, t, d = len(starts), 2, 4, 80, 128 if tc else 64
        rng = np.random.default_rng(17 + d)
        kp = spec.Params("turboquant", role="k", window=0, seed=4, layer=1, bits=4).resolved()
        vp = spec.Params("turboquant" if tc else "rabitq", role="v", window=0, seed=4, layer=1,
                         **(dict(bits=4) if tc else {})).resolved()
        kx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
        vx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
        q = mx.array(rng.standard_normal((b, hkv * rep, 1, d)).astype(np.float32)).astype(mx.float16)
        k, v = _packed(kx, kp), _packed(vx, vp)
        scale = 1.0 / np.sqrt(d)
        mask = oatt.RowStarts(mx.array(starts, dtype=mx.int32))
        new = (kx[:, :, t - 1:], vx[:, :, t - 1:], kp, vp, True)
        # the rows below the starts as they are (an attended one would change the output) and all bits set
        got0 = emulate(q, k, v, scale, mask, append=new)[0]
        got, rows, token, summary = emulate(q, k, v, scale, mask, append=new, poison_below=starts)
        ats = (km_._side_dtype(kp, mx.float16), km_._side_dtype(vp, mx.float16))
        plan = katt.launch_plan(q, k, v, scale, mask, mx.zeros((1,), mx.bool_), ats,
                                {"kx": new[0], "kconst": kfused.constants(kp, hkv, 1, d), "vx": new[1],
                                 "vconst": kfused.constants(vp, hkv, 1, d)})
        assert plan.key[6] and plan.key[7] and bool(plan.key[4]) == tc, plan.key
        assert not token.any() and not summary.any(), (token.tolist(), summary.tolist())
        for rec, role in ((k, "k"), (v, "v")):
            for kn, name in katt._field_names(rec.params.method, role):
                want = _strided(rec.fields[name], 0)[:, :, t - 1:]
                assert np.array_equal(rows[kn][:, :, t - 1:].view(np.uint8), want.view(np.uint8)), (role, name)
        qf, kd, vd = np.array(q.astype(mx.float32)), np.array(k.dequantized()), np.array(v.dequantized())
        want = np.concatenate([f64_attention(qf[i:i + 1], kd[i:i + 1, :, s0:], vd[i:i + 1, :, s0:], scale, False)
                               for i, s0 in enumerate(starts)])
        for g, how in ((got0, "as stored"), (got, "all bits set")):
            np.testing.assert_allclose(g, want, rtol=0, atol=2e-3 * np.abs(want).max(),
                                       err_msg=f"APPEND + row starts, rows below the starts {how}")
    finally:
        katt._static.cache_clear()


UNEVEN_CASES = [
    # key method/kw/window, value method/kw/window, (B, Hkv, rep, L, T, d), queries dtype, causal: the two roles
    # flush at different points, so their records have different encoded prefixes
    (("turboquant", dict(bits=3), 0), ("kivi", dict(bits=2, group_size=16), 16), (1, 2, 2, 1, 100, 64), mx.float16,
     False),
    (("kivi", dict(bits=2, group_size=16), 16), ("turboquant", dict(bits=4), 0), (2, 1, 3, 2, 100, 64), mx.float16,
     True),
    (("kivi", dict(bits=4, group_size=32), 0), ("kivi", dict(bits=2, group_size=16), 8), (1, 2, 1, 1, 100, 64),
     mx.bfloat16, False),
]


@pytest.mark.parametrize("case", UNEVEN_CASES, ids=[f"{c[0][0]}{c[0][2]}-{c[1][0]}{c[1][2]}" for c in UNEVEN_CASES])
def test_records_with_different_encoded_prefixes_through_the_kernels(case, monkeypatch, tune):
    """Keys and values of different methods or windows (keys turboquant 3-bit + values KIVI 2-bit, the recommended
    quality configuration) have encoded prefixes of different lengths; accelerated.attention.aligned hands the
    kernels both at the common prefix, the rest of the longer one decoded in front of its window. Within the
    tolerance tier of float64 over the records' own decode, and of the ops path over the records as stored."""
    from veloxquant.accelerated import attention as vatt
    tune(tokens_per_split=8)
    (km, kkw, kwin), (vm, vkw, vwin), (b, hkv, rep, lq, t, d), qdt, causal = case
    rng = np.random.default_rng(t + d + len(km + vm))
    kp = spec.Params(km, role="k", window=kwin, seed=2, layer=1, **kkw).resolved()
    vp = spec.Params(vm, role="v", window=vwin, seed=2, layer=1, **vkw).resolved()
    kx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
    vx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
    q = mx.array((rng.standard_normal((b, hkv * rep, lq, d)) * 2).astype(np.float32)).astype(qdt)
    k, v = _packed(kx, kp), _packed(vx, vp)
    assert k.encoded != v.encoded, "the case must have uneven prefixes"
    ka, va = vatt.aligned(k, v)
    n = vatt.common_prefix(k, v)
    assert ka.encoded == va.encoded == n > 0 and ka.window.shape[2] == va.window.shape[2] == t - n
    scale = 1.0 / np.sqrt(d)
    mask = "causal" if causal else None
    _check_body(emulate(q, ka, va, scale, mask), q, k, v, scale, causal, qdt)


@pytest.mark.parametrize("start", [0, 21], ids=["start0", "start21"])
def test_row_starts_over_records_with_a_window(start, monkeypatch, tune):
    """A sliding-window KIVI cache holds up to G - 1 tokens older than its mask's window (rotating.py); its
    make_mask's array is remembered as a row start and the kernels skip those encoded tokens (supports: only where
    the start is known to stay below the window). Against float64 over the tokens from the start."""
    tune(tokens_per_split=8)
    b, hkv, rep, t, d = 1, 2, 2, 120, 64
    rng = np.random.default_rng(5 + start)
    kp = spec.Params("kivi", role="k", window=16, seed=4, layer=3, bits=2, group_size=16).resolved()
    vp = spec.Params("kivi", role="v", window=16, seed=4, layer=3, bits=2, group_size=16).resolved()
    kx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
    vx = mx.array(rng.standard_normal((b, hkv, t, d)).astype(np.float32)).astype(mx.float16)
    q = mx.array(rng.standard_normal((b, hkv * rep, 1, d)).astype(np.float32)).astype(mx.float16)
    k, v = _packed(kx, kp), _packed(vx, vp)
    assert k.window.shape[2] > 0 and 0 <= start <= k.encoded
    mask = oatt.RowStarts(mx.array([start], dtype=mx.int32), False, None, (start,))
    with monkeypatch.context() as m:
        m.setattr(katt.backend, "available", lambda: (True, "emulated"))
        assert katt.supports(q, k, v, mask)
        assert not katt.supports(q, k, v, oatt.RowStarts(mx.array([k.encoded + 1], dtype=mx.int32), False, None,
                                                          (k.encoded + 1,))), "a start inside the window"
    scale = 1.0 / np.sqrt(d)
    got = emulate(q, k, v, scale, mask)      # (a hidden token attended would move the output off the float64)
    qf, kd, vd = np.array(q.astype(mx.float32)), np.array(k.dequantized()), np.array(v.dequantized())
    want = f64_attention(qf, kd[:, :, start:], vd[:, :, start:], scale, False)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max(), err_msg="row starts + window")
