// The attention kernels' header (cuda): address spaces, float helpers, then the shared helpers.
#define VQ_INLINE __device__ inline
#define DEVICE
#define TGMEM
#define THREAD
#define NEG_INF (-__int_as_float(0x7f800000))
__device__ inline float vq_max(float a, float b) { return fmaxf(a, b); }
__device__ inline int vq_min(int a, int b) { return a < b ? a : b; }
// ex2.approx.ftz: one MUFU instruction (exp2f adds a denormal range fix per call); within 2 ulp, results
// below 2^-126 flushed to 0 (weights that small are below any attention budget: conformance ATTN_SAFETY)
__device__ inline float vq_exp2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ inline float vq_round_to(float, float x) { return x; }
__device__ inline float vq_round_to(__half, float x) { return __half2float(__float2half_rn(x)); }
__device__ inline float vq_round_to(__nv_bfloat16, float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
#include "attention_helpers.h"
