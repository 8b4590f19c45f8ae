    // prod (tc_two_setup.cuh): a score gains n gamma A_d (q2 . s), the QJL part of the key (a row's two parts summed
    // as sc's, scaled back by ukb); masked scores stay -inf
    if (MK == 3) {
      for (int x = 0; x < 4; ++x) {
        const float yb = sc2[x >> 1][x & 1];
        const float zb = yb + SHFL_XOR(yb, 16);
        xa[x] = (xa[x] == NEG_INF) ? NEG_INF : xa[x] + zb * ukb * knc2[x] * knc[x];
      }
    }
