// tc_loop_values.cuh's value codes of m-tile mt with a 3-bit role (tc_tens_sizes.cuh): 3-bit codes mt and
// D / 16 + mt from the realigned words, else tc_words_values.cuh's (word index constant, shift from vsh).
#include "tc_values_at.cuh"
#define VQ_TC_V(x, i, wi, si) \
  ((VB1 == 3) ? VQ_TC_ALIGN(vwc[x], VWL, (i) / 10, vsh) >> (3 * ((i) % 10)) : vwc[x][wi] >> (si))
      const uint32_t e0 = SHFL_IDX(tabv, VQ_TC_V(0, mt, wa, sa));
      const uint32_t e1 = SHFL_IDX(tabv, VQ_TC_V(1, mt, wa, sa));
      const uint32_t e2 = SHFL_IDX(tabv, VQ_TC_V(2, mt, wa, sa));
      const uint32_t e3 = SHFL_IDX(tabv, VQ_TC_V(3, mt, wa, sa));
      const uint32_t f0 = SHFL_IDX(tabv, VQ_TC_V(0, D / 16 + mt, wb, sb));
      const uint32_t f1 = SHFL_IDX(tabv, VQ_TC_V(1, D / 16 + mt, wb, sb));
      const uint32_t f2 = SHFL_IDX(tabv, VQ_TC_V(2, D / 16 + mt, wb, sb));
      const uint32_t f3 = SHFL_IDX(tabv, VQ_TC_V(3, D / 16 + mt, wb, sb));
#undef VQ_TC_V
