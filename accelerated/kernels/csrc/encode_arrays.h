// The encode body's threadgroup arrays, declared by the encode kernel itself (encode.h's VQ_ENCODE_ARRAYS).
  SHARED(uint8_t, cst, 8192);                    // per-warp code staging (3/5/6/7-bit packing)
  SHARED(uint32_t, flt, 64);                     // per-warp fault flags
  // quantize's sorted boundaries (B1 of bits <= 4 bits: 15 at most; rvq's B2) in threadgroup memory: one load
  // per lookup step instead of a global load with 64-bit addressing
  SHARED(float, f_tq, 32);
