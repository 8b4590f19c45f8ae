// tc_loop_merge.cuh with VPARTS value parts a row (prod values: o2, the sketch-domain sums, as part 1): swo holds part
// p of warp w's row r at p * SWP + (w * QB + r) * D. The window split writes part 0 only: the combine reads no
// sketch part of split S.
  SHARED(float, swo, NW * QB * VPARTS * D);
  SHARED(float, swm, NW * 4);
  SHARED(float, swl, NW * 4);
  SHARED(float, sacc, QB * VPARTS * D);
  SHARED(float, sml, 2 * QB);
  constexpr int SWP = NW * QB * D;        // one part of swo
  if (is_win) {
#include "tc_window.h"
  } else {
#define VQ_TC_O2 1
#include "tc_merge_warps.cuh"
  }
#include "tc_merge_block.cuh"
#undef VQ_TC_O2
