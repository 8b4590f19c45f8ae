// The query fragments VQ_TC_QA(ks), A of the scores (after tc_query_scale.cuh, its parameters; they end here): M row
// g, coordinate tig * D / 4 + 4 ks + j (a0 slots j = 0, 1, a2 j = 2, 3), row ra of VQ_TC_Q times VQ_TC_FQ, its hi
// part or with part 1 its lo part; M rows 8-15 are zero.
  for (int ks = 0; ks < KS; ++ks) {
    for (int jp = 0; jp < 2; ++jp) {
      const int c = tig * (D / 4) + 4 * ks + 2 * jp;
      float x0 = has_a ? VQ_TC_Q[ra * D + c] * VQ_TC_FQ : 0.0f;
      float x1 = has_a ? VQ_TC_Q[ra * D + c + 1] * VQ_TC_FQ : 0.0f;
      if (part == 1) {
        x0 -= vq_hround(x0);
        x1 -= vq_hround(x1);
      }
      VQ_TC_QA(ks)[jp] = vq_h2(x0, x1);
    }
  }
#undef VQ_TC_Q
#undef VQ_TC_FQ
#undef VQ_TC_QA
