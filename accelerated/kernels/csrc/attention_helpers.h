// Helpers of the attention kernels, after a backend's attention header (which defines VQ_INLINE, DEVICE, ...).

// loops a threadgroup runs once (set-up, merge, combine; over threadgroup or device memory, never a register
// array): CUDA with accelerated.kernels.attention.COLD_LOOPS defines VQ_COLD as `#pragma unroll 1` (less code
// to fetch once per threadgroup; same operations in the same order), elsewhere it is nothing
#ifndef VQ_COLD
#define VQ_COLD
#endif
// a loop over the U token slots that must be unrolled (its indices into register arrays constant): CUDA's prelude
// defines it as `#pragma unroll`; elsewhere nothing (Metal not measured)
#ifndef VQ_UNROLL
#define VQ_UNROLL
#endif
// code j of a packed row: word j / (32 / B), bits B * (j % (32 / B))      (spec/packing.md); the word can be loaded
// early (vq_code_word) and the code taken from it later (vq_code_w)
template <int B>
VQ_INLINE uint32_t vq_code_word(const DEVICE uint32_t* row, int j) {
  return row[j / (32 / B)];
}

template <int B>
VQ_INLINE uint32_t vq_code_w(uint32_t w, int j) {
  return (w >> (B * (j % (32 / B)))) & ((1u << B) - 1u);
}

template <int B>
VQ_INLINE uint32_t vq_code(const DEVICE uint32_t* row, int j) {
  return vq_code_w<B>(vq_code_word<B>(row, j), j);
}

// B = 1, 2, 4: the 8 codes of chunk c (codes 8c .. 8c + 7, B bytes) lie in one word of the row; that word
// can be loaded early (vq_chunk_word) and split into codes later (vq_codes_w)
template <int B>
VQ_INLINE uint32_t vq_chunk_word(const DEVICE uint32_t* row, int c) {
  return row[(c * B) / 4];
}

// the 8 codes of chunk c (codes 8c .. 8c + 7) of a packed row: from its word for B = 1, 2, 4 (vq_chunk_word),
// else one code at a time; the body looks their values up with a warp shuffle (VQ_LOOKUP).
template <int B>
VQ_INLINE void vq_codes_w(uint32_t w, int c, THREAD uint32_t* out) {
  const int sh = 8 * ((c * B) % 4);
  for (int k = 0; k < 8; ++k) {
    out[k] = (w >> (sh + B * k)) & ((1u << B) - 1u);
  }
}

template <int B>
VQ_INLINE void vq_codes(const DEVICE uint32_t* row, int c, THREAD uint32_t* out) {
  if (B == 1 || B == 2 || B == 4) {
    vq_codes_w<B>(vq_chunk_word<B>(row, c), c, out);
  } else {
    for (int k = 0; k < 8; ++k) {
      out[k] = vq_code<B>(row, 8 * c + k);
    }
  }
}

// one stage of the ascending butterfly of H (rotation.md) over `rows` rows of D values of a: pairs
// (j, j + hh) -> (x0 + x1, x0 - x1), shared by threads t, t + nt, ... (the caller puts a barrier after it)
template <int D>
VQ_INLINE void vq_butterfly_stage(TGMEM float* a, int rows, int hh, int t, int nt) {
  VQ_COLD
  for (int i = t; i < rows * D / 2; i += nt) {
    const int k = i % (D / 2);
    const int o = (i / (D / 2)) * D + (k / hh) * 2 * hh + (k % hh);
    const float x0 = a[o];
    const float x1 = a[o + hh];
    a[o] = x0 + x1;
    a[o + hh] = x0 - x1;
  }
}
