// tc_loop.cuh's end: the warps' states merged through threadgroup memory into sacc, sml (window split: tc_window.h).
  SHARED(float, swo, NW * QB * D);
  SHARED(float, swm, NW * 4);
  SHARED(float, swl, NW * 4);
  SHARED(float, sacc, QB * D);
  SHARED(float, sml, 2 * QB);
  if (is_win) {
#include "tc_window.h"
  } else {
#include "tc_merge_warps.cuh"
  }
#include "tc_merge_block.cuh"
