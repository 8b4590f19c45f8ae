// tc_kivi_loop.cuh's setup: KIVI records (MK = MV = 4) on tensor cores; the fragment maps are tc_loop_setup.cuh's.
  // keys k = s[grp, c] code + z[grp, c] per group of KG tokens: the A operand is the query times the group's
  // scales (rebuilt per group, kgrp), the B operand the codes as float16 integers (exact: no lo part), plus
  // zq = q . z[grp] per row; values v = s code + z per token and group of VG coordinates, dequantized into A
  constexpr int KS = D / 16;
#include "tc_words_sizes.cuh"
  constexpr int MT = D / 16;
  constexpr uint32_t VMASK = (1u << VB1) - 1u;
#include "tc_lanes.cuh"
  // chunks of 16 tokens from t0 rounded down to 16, so that a chunk lies in one key group (KG a multiple of 16);
  // the tokens below t0 are the split before's (masked)
#if VQ_RAGGED
  // ... a ragged row's groups start at its phase vq_ph (partial_setup_tokens.h): t0 rounded down to vq_ph mod 16 (mod
  // 32 with KP = 2); an empty range takes no chunk (its rounded start may lie below the row's first group)
  const int ta = t0 - ((t0 - vq_ph) & (16 * KP - 1));
  const int nch = (is_win || t1 <= t0) ? 0 : (t1 - ta + 15) / 16;
#else
  // ... with KP = 2 (tuning's tc_kpairs) from t0 rounded down to 32: a warp's two consecutive chunks then lie in one
  // key group (KG >= 32), whose query fragments it builds once for both (tc_kivi_loop.cuh's order)
  const int ta = t0 - (t0 & (16 * KP - 1));
  const int nch = is_win ? 0 : (t1 - ta + 15) / 16;
#endif
  const float ftv = 1024.0f;              // P' = p * 2^10 (p <= 1); the values' A scale fv as the norms' scale
  const float lane_code = (float)(lane % (1 << KB1));
  const uint32_t tabk = vq_h2(lane_code, 0.0f);
#include "tc_state.cuh"
  uint32_t qa[KS][2];
  float uka = 0.0f;                       // 1 / the row's power of two of the scaled query, this group's
  float zq = 0.0f;                        // q . z[grp] of the row, this group's
  int kgrp = -1;
  const DEVICE uint32_t* kbase = kc1 + (int64_t)b * kc1_strides[0] + (int64_t)h * kc1_strides[1] + KWL * tig;
  const int vsh = VWHOLE ? 0 : (g * (D / 8) * VB1) % 32;
  const DEVICE uint32_t* vbase = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1]
                                 + (VWHOLE ? VWL * g : (g * (D / 8) * VB1) / 32);
  const int64_t kgo = (int64_t)b * kgs_strides[0] + (int64_t)h * kgs_strides[1];
  // a lane group's D / 8 value coordinates lie in one coordinate group (D / 8 <= 16 <= VG): one (s, z) per token
  const int64_t vgo = (int64_t)b * vgs_strides[0] + (int64_t)h * vgs_strides[1]
                      + (int64_t)((g * (D / 8)) / VG) * vgs_strides[3];
