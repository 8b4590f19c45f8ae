// tc_mixed_loop.cuh's end: as tc_loop_merge.cuh, with a MIXED partial's window split and scalar splits in scalar
// arithmetic (tc_mixed_split.h: each role's window from its own rows).
  SHARED(float, swo, NW * QB * D);
  SHARED(float, swm, NW * 4);
  SHARED(float, swl, NW * 4);
  SHARED(float, sacc, QB * D);
  SHARED(float, sml, 2 * QB);
  if (is_win && !VQ_MIXED) {
#include "tc_window.h"
  } else if (is_win || is_mix) {
#if VQ_MIXED
#include "tc_mixed_split.h"
#endif
  } else {
#include "tc_merge_warps.cuh"
  }
#include "tc_merge_block.cuh"
