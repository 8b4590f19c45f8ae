// combine_rows_strided.h's (a), (b): each row's max over the splits (me) and its rescaled sum of sums (le).
  // (a) each row's max over the splits: per thread, then a tree over the CNT threads (a power of two)
  for (int r = 0; r < CQB; ++r) {
    float pm = NEG_INF;
    if (r < NR) {
      for (int s2 = CT; s2 < S; s2 += CNT) {
        pm = vq_max(pm, o_ml[((crow0 + r) * (S + 1) + s2) * 2]);
      }
    }
    cred[r * CNT + CT] = pm;
  }
  VQ_COLD
  for (int half = CNT / 2; half > 0; half >>= 1) {
    BARRIER();
    VQ_COLD
    for (int i = CT; i < CQB * half; i += CNT) {
      const int o = (i / half) * CNT + i % half;
      cred[o] = vq_max(cred[o], cred[o + half]);
    }
  }
  BARRIER();
  float me[CQB];
  for (int r = 0; r < CQB; ++r) {
    me[r] = cred[r * CNT];
  }
  BARRIER();
  // (b) each row's sum of the splits' sums, rescaled to its max, likewise
  for (int r = 0; r < CQB; ++r) {
    float pl = 0.0f;
    if (r < NR) {
      for (int s2 = CT; s2 < S; s2 += CNT) {
        const int64_t o = ((crow0 + r) * (S + 1) + s2) * 2;
        const float ms = o_ml[o];
        pl += (ms == NEG_INF) ? 0.0f : o_ml[o + 1] * vq_exp2(ms - me[r]);
      }
    }
    cred[r * CNT + CT] = pl;
  }
  VQ_COLD
  for (int half = CNT / 2; half > 0; half >>= 1) {
    BARRIER();
    VQ_COLD
    for (int i = CT; i < CQB * half; i += CNT) {
      const int o = (i / half) * CNT + i % half;
      cred[o] = cred[o] + cred[o + half];
    }
  }
  BARRIER();
  float le[CQB];
  for (int r = 0; r < CQB; ++r) {
    le[r] = cred[r * CNT];
  }
