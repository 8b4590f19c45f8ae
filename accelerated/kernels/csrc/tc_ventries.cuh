// A value m-tile's table entries (tc_words_values.cuh, tc_two_values.cuh; tc_loop_values.cuh defines it for them):
// E0 .. E3 of value slots 0-3's codes in word WA at bit SA of their words W, F0 .. F3 of those in word WB at bit SB,
// looked up in table TAB.
#define VQ_TC_VENTRIES(E, F, TAB, W, WA, SA, WB, SB) \
      const uint32_t E##0 = SHFL_IDX(TAB, W[0][WA] >> SA); \
      const uint32_t E##1 = SHFL_IDX(TAB, W[1][WA] >> SA); \
      const uint32_t E##2 = SHFL_IDX(TAB, W[2][WA] >> SA); \
      const uint32_t E##3 = SHFL_IDX(TAB, W[3][WA] >> SA); \
      const uint32_t F##0 = SHFL_IDX(TAB, W[0][WB] >> SB); \
      const uint32_t F##1 = SHFL_IDX(TAB, W[1][WB] >> SB); \
      const uint32_t F##2 = SHFL_IDX(TAB, W[2][WB] >> SB); \
      const uint32_t F##3 = SHFL_IDX(TAB, W[3][WB] >> SB);
