// tc_loop_values.cuh's value codes of m-tile mt, table entries e0 .. e3 and f0 .. f3 (tc_words_sizes.cuh's layout).
#include "tc_values_at.cuh"
      const uint32_t e0 = SHFL_IDX(tabv, vwc[0][wa] >> sa);
      const uint32_t e1 = SHFL_IDX(tabv, vwc[1][wa] >> sa);
      const uint32_t e2 = SHFL_IDX(tabv, vwc[2][wa] >> sa);
      const uint32_t e3 = SHFL_IDX(tabv, vwc[3][wa] >> sa);
      const uint32_t f0 = SHFL_IDX(tabv, vwc[0][wb] >> sb);
      const uint32_t f1 = SHFL_IDX(tabv, vwc[1][wb] >> sb);
      const uint32_t f2 = SHFL_IDX(tabv, vwc[2][wb] >> sb);
      const uint32_t f3 = SHFL_IDX(tabv, vwc[3][wb] >> sb);
