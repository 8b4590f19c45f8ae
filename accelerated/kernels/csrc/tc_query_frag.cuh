// The query fragments qa, A of the scores (tc_loop_setup.cuh, tc_affine_setup.cuh): M row g, coordinate
// tig * D / 4 + 4 ks + j (a0 slots j = 0, 1, a2 j = 2, 3), row ra's scaled query, its hi part or with part 1 its lo
// part; M rows 8-15 are zero.
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
