// tc_mixkv_loop.cuh's setup: KIVI keys (MK = 4) beside per-token codebook values (turboquant MV = 0, rabitq MV = 2).
// The keys' side is tc_kivi_setup.cuh's (A: the query times the key group's scales, rebuilt per group; B: the codes as
// float16 integers; zq = q . z[grp] per row), the values' tc_loop_setup.cuh's (the codebook's entries in tabv, scaled
// by ftv; the token's norm in P'); the fragment maps and code layouts are theirs (VQ_TC_SIZES / VQ_TC_BASES:
// tc_tens_*.cuh).
  constexpr int KS = D / 16;
#include VQ_TC_SIZES
  constexpr int MT = D / 16;
#include "tc_lanes.cuh"
  // chunks of 16 tokens from t0 rounded down to 16 KP, so that a warp's KP chunks lie in one key group (tc_kpairs:
  // tc_kivi_setup.cuh); the tokens below t0 are the split before's (masked); an empty split (a MIXED partial's
  // scalar splits: their tokens are tc_mixed_split.h's) takes no chunk
  const int ta = t0 - (t0 & (16 * KP - 1));
  const int nch = (is_win || t1 <= t0) ? 0 : (t1 - ta + 15) / 16;
  // the value table's scale: a power of two that puts the largest |entry| near 2^11 (tc_loop_setup.cuh)
  float mtv = fabsf(rv1);
  for (int o = 16; o > 0; o >>= 1) {
    mtv = vq_max(mtv, SHFL_XOR(mtv, o));
  }
  const float ftv = vq_pow2_for(mtv, 11);
  const float tv = rv1 * ftv;
  const uint32_t tabv = vq_h2(tv, tv - vq_hround(tv));
  const float lane_code = (float)(lane % (1 << KB1));
  const uint32_t tabk = vq_h2(lane_code, 0.0f);
#include "tc_state.cuh"
  uint32_t qa[KS][2];
  float uka = 0.0f;                       // 1 / the row's power of two of the scaled query, this group's
  float zq = 0.0f;                        // q . z[grp] of the row, this group's
  int kgrp = -1;
#include VQ_TC_BASES
  const int64_t kgo = (int64_t)b * kgs_strides[0] + (int64_t)h * kgs_strides[1];
  const int64_t vso = (int64_t)b * vs0_strides[0] + (int64_t)h * vs0_strides[1];
  const int64_t vso1 = (MV == 2) ? (int64_t)b * vs1_strides[0] + (int64_t)h * vs1_strides[1] : 0;
