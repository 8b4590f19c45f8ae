// tc_mixed_loop.cuh's end: as tc_loop_merge.cuh, with a MIXED partial's split S - 1 in scalar arithmetic beside the
// window split (tc_mixed_split.h).
  SHARED(float, swo, NW * QB * D);
  SHARED(float, swm, NW * 4);
  SHARED(float, swl, NW * 4);
  SHARED(float, sacc, QB * D);
  SHARED(float, sml, 2 * QB);
  if (is_win) {
#include "tc_window.h"
#if VQ_MIXED
  } else if (is_mix) {
#include "tc_mixed_split.h"
#endif
  } else {
#include "tc_merge_warps.cuh"
  }
#include "tc_merge_block.cuh"
