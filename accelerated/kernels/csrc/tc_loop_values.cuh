// tc_loop.cuh's value sums of one chunk: O^T += V^T P'^T on tensor cores (P' = p * value norm * fv).
    // -- P' = p * value norm * fv, its part of the row as the B operand (k: tokens 2 tig, 2 tig + 1 / + 8, n: g)
    float ua[4];
    for (int x = 0; x < 4; ++x) {
      ua[x] = pa[x] * vnc[x] * fv;
      if (part == 1) {
        ua[x] -= vq_hround(ua[x]);
      }
    }
    const uint32_t p0 = vq_h2(ua[0], ua[1]);
    const uint32_t p1 = vq_h2(ua[2], ua[3]);
    // -- value sums O^T += V^T P'^T: m-tile mt has coordinates g * D / 8 + mt (rows g) and + D / 16 (rows g + 8)
    //    of tokens 2 tig, 2 tig + 1 (a0, a1) and 2 tig + 8, 2 tig + 9 (a2, a3)
    // below 32 bits a group (VWL = 1) the group's codes lie in its one word: index 0 written as a constant, since
    // an index through the run-time vsh put vwc in local memory (60 loads per chunk for rabitq, sm_90)
    for (int mt = 0; mt < MT; ++mt) {
      const int wa = VWHOLE ? (VB1 * mt) / 32 : 0;
      const int sa = VWHOLE ? (VB1 * mt) % 32 : vsh + VB1 * mt;
      const int wb = VWHOLE ? (VB1 * (D / 16 + mt)) / 32 : 0;
      const int sb = VWHOLE ? (VB1 * (D / 16 + mt)) % 32 : vsh + VB1 * (D / 16 + mt);
      const uint32_t e0 = SHFL_IDX(tabv, vwc[0][wa] >> sa);
      const uint32_t e1 = SHFL_IDX(tabv, vwc[1][wa] >> sa);
      const uint32_t e2 = SHFL_IDX(tabv, vwc[2][wa] >> sa);
      const uint32_t e3 = SHFL_IDX(tabv, vwc[3][wa] >> sa);
      const uint32_t f0 = SHFL_IDX(tabv, vwc[0][wb] >> sb);
      const uint32_t f1 = SHFL_IDX(tabv, vwc[1][wb] >> sb);
      const uint32_t f2 = SHFL_IDX(tabv, vwc[2][wb] >> sb);
      const uint32_t f3 = SHFL_IDX(tabv, vwc[3][wb] >> sb);
      vq_mma(o[mt], vq_perm(e0, e1, 0x5410u), vq_perm(f0, f1, 0x5410u), vq_perm(e2, e3, 0x5410u),
             vq_perm(f2, f3, 0x5410u), p0, p1);
      vq_mma(o[mt], vq_perm(e0, e1, 0x7632u), vq_perm(f0, f1, 0x7632u), vq_perm(e2, e3, 0x7632u),
             vq_perm(f2, f3, 0x7632u), p0, p1);
#include VQ_TC_VALUES2
    }
