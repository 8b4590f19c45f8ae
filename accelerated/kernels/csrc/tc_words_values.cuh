// tc_loop_values.cuh's value codes of m-tile mt, table entries e0 .. e3 and f0 .. f3 (tc_words_sizes.cuh's layout).
      // below 32 bits a group (VWL = 1) the group's codes lie in its one word: index 0 written as a constant, since
      // an index through the run-time vsh put vwc in local memory (60 loads per chunk for rabitq, sm_90)
      const int wa = VWHOLE ? (VB1 * mt) / 32 : 0;
      const int sa = VWHOLE ? (VB1 * mt) % 32 : vsh + VB1 * mt;
      const int wb = VWHOLE ? (VB1 * (D / 16 + mt)) / 32 : 0;
      const int sb = VWHOLE ? (VB1 * (D / 16 + mt)) % 32 : vsh + VB1 * (D / 16 + mt);
      const uint32_t e0 = SHFL_IDX(tabv, vwc[0][wa] >> sa);
      const uint32_t e1 = SHFL_IDX(tabv, vwc[1][wa] >> sa);
      const uint32_t e2 = SHFL_IDX(tabv, vwc[2][wa] >> sa);
      const uint32_t e3 = SHFL_IDX(tabv, vwc[3][wa] >> sa);
      const uint32_t f0 = SHFL_IDX(tabv, vwc[0][wb] >> sb);
      const uint32_t f1 = SHFL_IDX(tabv, vwc[1][wb] >> sb);
      const uint32_t f2 = SHFL_IDX(tabv, vwc[2][wb] >> sb);
      const uint32_t f3 = SHFL_IDX(tabv, vwc[3][wb] >> sb);
