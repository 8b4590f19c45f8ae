// tc_loop.cuh's setup: power-of-two scales, the query fragments qa, the code tables, the running state, row bases.
  // 3-4 on tensor cores (attention_tc.py): per warp, chunks of 16 tokens; lane = 4 g + tig; at most 4 query rows
  constexpr int KS = D / 16;              // k-steps of a score tile
#include VQ_TC_SIZES
  constexpr int MT = D / 16;              // m-tiles of the value sums (coordinates in M)
  const int g = lane >> 2;
  const int tig = lane & 3;
  const int part = g >> 2;                // score M row g / value N column g: part 0 (hi) or 1 (lo) of row g % 4
  const int ra = g & 3;
  const bool has_a = ra < QB;
  // scales (powers of two): this lane's query row, the code tables (the value norms' below, as they come)
  float fqa = 1.0f;
  for (int r = 0; r < QB; ++r) {
    float mx = 0.0f;
    for (int c = lane; c < D; c += 32) {
      mx = vq_max(mx, fabsf(sq[r * D + c]));
    }
    for (int o = 16; o > 0; o >>= 1) {
      mx = vq_max(mx, SHFL_XOR(mx, o));
    }
    fqa = (r == ra) ? vq_pow2_for(mx, 11) : fqa;
  }
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
  // query fragments (A of the scores: M row g; coordinate tig * D / 4 + 4 ks + j, a0 slots j = 0, 1, a2 j = 2, 3;
  // M rows 8-15 are zero)
  uint32_t qa[KS][2];
  for (int ks = 0; ks < KS; ++ks) {
    for (int jp = 0; jp < 2; ++jp) {
      const int c = tig * (D / 4) + 4 * ks + 2 * jp;
      float x0 = has_a ? sq[ra * D + c] * fqa : 0.0f;
      float x1 = has_a ? sq[ra * D + c + 1] * fqa : 0.0f;
      if (part == 1) {
        x0 -= vq_hround(x0);
        x1 -= vq_hround(x1);
      }
      qa[ks][jp] = vq_h2(x0, x1);
    }
  }
  // code tables: entry lane % 16 (4-bit codes), scaled, its float16 hi and lo parts in one word
  const float tk = rk1 * ftk;
  const float tv = rv1 * ftv;
  const uint32_t tabk = vq_h2(tk, tk - vq_hround(tk));
  const uint32_t tabv = vq_h2(tv, tv - vq_hround(tv));
  const float uka = (1.0f / fqa) * (1.0f / ftk);     // exact: powers of two
  const int qpa = qpos[has_a ? ra : 0];
  float m_a = NEG_INF;
  float l_a = 0.0f;
  float fv = 0.0f;                        // P' = p * value norm * fv: set by the first chunk, lowered when a chunk's
                                          // norms would take P' past 2^11 (a power of two: O is scaled with it)
  float o[MT][4];
  for (int mt = 0; mt < MT; ++mt) {
    for (int i = 0; i < 4; ++i) {
      o[mt][i] = 0.0f;
    }
  }
#include VQ_TC_BASES
  // rabitq (MK / MV = 2): a token's factor is g = (n s_d) / ip (0 where ip = 0), its codes' table the signs
  const int64_t kso1 = (MK == 2) ? (int64_t)b * ks1_strides[0] + (int64_t)h * ks1_strides[1] : 0;
  const int64_t vso1 = (MV == 2) ? (int64_t)b * vs1_strides[0] + (int64_t)h * vs1_strides[1] : 0;
