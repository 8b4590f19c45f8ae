"""The thin per-backend preludes of source.py's bodies (CUDA / NVRTC and Metal): the macros the bodies use
and the exact-arithmetic helpers behind them (see source.py for the list and the rules).
"""
from __future__ import annotations

# ---- preludes -----------------------------------------------------------------------------------------
# CUDA (NVRTC): the _rn intrinsics are single correctly rounded ops that are never contracted into FMA;
# NVRTC defaults give IEEE division/sqrt and no flush to zero, and the intrinsics pin that down explicitly.
CUDA_HEADER = """
template <typename T> __device__ __forceinline__ T vq_to(float f);
template <> __device__ __forceinline__ float vq_to<float>(float f) { return f; }
template <> __device__ __forceinline__ __half vq_to<__half>(float f) { return __float2half_rn(f); }
template <> __device__ __forceinline__ __nv_bfloat16 vq_to<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}
"""
CUDA_PRELUDE = """
#define TID threadIdx.x
#define TOKEN blockIdx.x
#define HEAD blockIdx.y
#define BATCH blockIdx.z
#define NTOK gridDim.x
#define NHEAD gridDim.y
#define LANE (threadIdx.x & 31u)
#define WARP (threadIdx.x >> 5)
#define NWARPS (blockDim.x >> 5)
#define GROUP blockIdx.x
#define NGROUPS gridDim.x
#define SHARED(type, name, n) __shared__ type name[n]
#define BARRIER() __syncthreads()
#define WARP_SYNC() __syncwarp()
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define SHFL_DOWN(v, s) __shfl_down_sync(0xffffffffu, (v), (s))
#define SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l))
#define ANY(p) (__any_sync(0xffffffffu, (p)) != 0)
#define BALLOT(p) __ballot_sync(0xffffffffu, (p))
#define ADD(a, b) __fadd_rn((a), (b))
#define SUB(a, b) __fsub_rn((a), (b))
#define MUL(a, b) __fmul_rn((a), (b))
#define DIV(a, b) __fdiv_rn((a), (b))
#define SQRT(a) __fsqrt_rn((a))
#define NEG(a) (-(a))
#define ABS(a) fabsf((a))
#define FLIP(v, m) __uint_as_float(__float_as_uint((v)) ^ (m))
#define MINF(a, b) fminf((a), (b))
#define MAXF(a, b) fmaxf((a), (b))
#define PIN(v) (v)
#define TO_F32(v) static_cast<float>(v)
#define TO_TS(v) vq_to<TS>((v))
#define VQ_OROW(bh, ne, i) ((bh) * (ne) + (i))
#define VQ_B1 B1
#define VQ_B2 B2
#define VQ_GS GS
#define VQ_KR KR
"""

# Metal: contraction is switched off for the whole translation unit, division and sqrt are the precise::
# variants (correctly rounded), every op is a named inline function, and PIN routes a product through an
# integer XOR with a zero the compiler cannot see. Not run here (no Apple GPU); compiled on Linux against
# a shim of the Metal builtins (tests/test_kernels_source.py).
METAL_HEADER = """
#pragma clang fp contract(off)
inline float vq_add(float a, float b) { return a + b; }
inline float vq_sub(float a, float b) { return a - b; }
inline float vq_mul(float a, float b) { return a * b; }
inline float vq_div(float a, float b) { return metal::precise::divide(a, b); }
inline float vq_sqrt(float a) { return metal::precise::sqrt(a); }
inline float vq_pin(float v, uint z) { return as_type<float>(as_type<uint>(v) ^ z); }
inline uint vq_ballot(bool p) { return (uint)(static_cast<uint64_t>(metal::simd_ballot(p)) & 0xffffffffull); }
"""
METAL_PRELUDE = """
#define TID thread_position_in_threadgroup.x
#define TOKEN threadgroup_position_in_grid.x
#define HEAD threadgroup_position_in_grid.y
#define BATCH threadgroup_position_in_grid.z
#define NTOK threadgroups_per_grid.x
#define NHEAD threadgroups_per_grid.y
#define LANE thread_index_in_simdgroup
#define WARP simdgroup_index_in_threadgroup
#define NWARPS simdgroups_per_threadgroup
#define GROUP threadgroup_position_in_grid.x
#define NGROUPS threadgroups_per_grid.x
#define SHARED(type, name, n) threadgroup type name[n]
#define BARRIER() threadgroup_barrier(metal::mem_flags::mem_threadgroup)
#define WARP_SYNC() metal::simdgroup_barrier(metal::mem_flags::mem_threadgroup)
#define SHFL_XOR(v, m) metal::simd_shuffle_xor((v), (ushort)(m))
#define SHFL_DOWN(v, s) metal::simd_shuffle_down((v), (ushort)(s))
#define SHFL(v, l) metal::simd_shuffle((v), (ushort)(l))
#define ANY(p) metal::simd_any((p))
#define BALLOT(p) vq_ballot((p))
#define ADD(a, b) vq_add((a), (b))
#define SUB(a, b) vq_sub((a), (b))
#define MUL(a, b) vq_mul((a), (b))
#define DIV(a, b) vq_div((a), (b))
#define SQRT(a) vq_sqrt((a))
#define NEG(a) (-(a))
#define ABS(a) metal::abs((a))
#define FLIP(v, m) as_type<float>(as_type<uint>((v)) ^ (m))
#define MINF(a, b) metal::fmin((a), (b))
#define MAXF(a, b) metal::fmax((a), (b))
#define PIN(v) vq_pin((v), pin0)
#define TO_F32(v) static_cast<float>(v)
#define TO_TS(v) static_cast<TS>((v))
#define VQ_OROW(bh, ne, i) ((bh) * (ne) + (i))
#define VQ_B1 B1
#define VQ_B2 B2
#define VQ_GS GS
#define VQ_KR KR
"""

PRELUDES = {"cuda": (CUDA_HEADER, CUDA_PRELUDE), "metal": (METAL_HEADER, METAL_PRELUDE)}
