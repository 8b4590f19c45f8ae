// tc_loop.cuh's setup: power-of-two scales, the query fragments qa, the code tables, the running state, row bases.
  // 3-4 on tensor cores (attention_tc.py): per warp, chunks of 16 tokens; lane = 4 g + tig; at most 4 query rows
  constexpr int KS = D / 16;              // k-steps of a score tile
#include VQ_TC_SIZES
  constexpr int MT = D / 16;              // m-tiles of the value sums (coordinates in M)
#include "tc_lanes.cuh"
  // scales (powers of two): this lane's query row, the code tables (the value norms' below, as they come)
  float fqa = 1.0f;
#define VQ_TC_Q sq
#define VQ_TC_FQ fqa
#define VQ_TC_QA(ks) qa[ks]
#include "tc_query_scale.cuh"
  float mtk = fabsf(rk1);
  float mtv = fabsf(rv1);
#include VQ_TC_MAX2
  for (int o = 16; o > 0; o >>= 1) {
    mtk = vq_max(mtk, SHFL_XOR(mtk, o));
    mtv = vq_max(mtv, SHFL_XOR(mtv, o));
  }
  const float ftk = vq_pow2_for(mtk, 11);
  const float ftv = vq_pow2_for(mtv, 11);
  const int nch = is_win ? 0 : (t1 - t0 + 15) / 16;    // the window split: tc_window.h
  const int64_t kso = (int64_t)b * ks0_strides[0] + (int64_t)h * ks0_strides[1];
  const int64_t vso = (int64_t)b * vs0_strides[0] + (int64_t)h * vs0_strides[1];
  uint32_t qa[KS][2];
#include "tc_query_frag.cuh"
  // code tables: entry lane % 16 (4-bit codes), scaled, its float16 hi and lo parts in one word
  const float tk = rk1 * ftk;
  const float tv = rv1 * ftv;
  const uint32_t tabk = vq_h2(tk, tk - vq_hround(tk));
  const uint32_t tabv = vq_h2(tv, tv - vq_hround(tv));
  const float uka = (1.0f / fqa) * (1.0f / ftk);     // exact: powers of two
#include "tc_state.cuh"
#include VQ_TC_BASES
  // rabitq (MK / MV = 2): a token's factor is g = (n s_d) / ip (0 where ip = 0), its codes' table the signs
  const int64_t kso1 = (MK == 2) ? (int64_t)b * ks1_strides[0] + (int64_t)h * ks1_strides[1] : 0;
  const int64_t vso1 = (MV == 2) ? (int64_t)b * vs1_strides[0] + (int64_t)h * vs1_strides[1] : 0;
