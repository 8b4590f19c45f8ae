
// tensor-core helpers (attention_tc.py)
__device__ inline uint32_t vq_h2(float lo, float hi) {          // float16x2 of (lo, hi): lo in the low half
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ inline float vq_hround(float x) { return __half2float(__float2half_rn(x)); }
__device__ inline uint32_t vq_perm(uint32_t a, uint32_t b, uint32_t sel) { return __byte_perm(a, b, sel); }
// the power of two that puts mx in [2^(e-1), 2^e) (exponent clamped to +-100: a row that small or large
// has scores / sums far outside any budget's resolution anyway)
__device__ inline float vq_pow2_for(float mx, int e) {
  int x;
  frexpf(mx, &x);
  const int sh = e - x;
  return ldexpf(1.0f, sh < -100 ? -100 : (sh > 100 ? 100 : sh));
}
#define VQ_ANY(p) (__any_sync(0xffffffffu, (p)) != 0)
// a / b for a rabitq factor (n s_d) / ip, ip in (0, 1]: the fast division (reciprocal and product, about 2 ulp;
// attention is the tolerance tier). The IEEE division's slow-path call spilled the chunk loop to local memory
// (docs/decode-step-analysis.md, the rabitq tensor-core loop)
__device__ inline float vq_fdiv(float a, float b) { return __fdividef(a, b); }
// D += A B: A 16 x 16 (rows g, g + 8; k 2 tig .. 2 tig + 1, 2 tig + 8 .. 2 tig + 9), B 16 x 8 (k as A's, column g)
__device__ inline void vq_mma(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                              uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <int N>
__device__ inline void vq_words(const uint32_t* p, uint32_t* out) {
  if (N % 4 == 0) {
    for (int i = 0; i < N; i += 4) {
      const uint4 v = *reinterpret_cast<const uint4*>(p + i);
      out[i] = v.x; out[i + 1] = v.y; out[i + 2] = v.z; out[i + 3] = v.w;
    }
  } else if (N == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    out[0] = v.x; out[1] = v.y;
  } else {
    for (int i = 0; i < N; ++i) out[i] = p[i];
  }
}
