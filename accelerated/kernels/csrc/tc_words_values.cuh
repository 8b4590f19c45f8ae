// tc_loop_values.cuh's value codes of m-tile mt, table entries e0 .. e3 and f0 .. f3 (tc_words_sizes.cuh's layout).
#include "tc_values_at.cuh"
      VQ_TC_VENTRIES(e, f, tabv, vwc, wa, sa, wb, sb)
