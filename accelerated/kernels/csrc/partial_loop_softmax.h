// partial_loop.h's online softmax: the masked scores, each query row's running max m and sum l, acc rescaled.
    // -- scores (masked: -inf), then the running max, sum and one rescale per query row
    float w[U][QB];
    for (int r = 0; r < QB; ++r) {
      float mb = NEG_INF;
      for (int u = 0; u < U; ++u) {
        // (no causal mask in a decode step: compiled out; rows past nq have zero queries and are never written)
        const bool use = ok[u] && (!CAUSAL || (is_win ? WQ + tu[u] : tu[u]) <= qpos[r]);
        const float x = kfac[u] * part[u][r];
        w[u][r] = use ? x : NEG_INF;
        mb = vq_max(mb, w[u][r]);
      }
      const float mn = vq_max(m[r], mb);
      float alpha = 1.0f;
      if (mn != NEG_INF) {
        alpha = vq_exp2(m[r] - mn);                   // m = -inf (nothing seen yet): exp2(-inf) = 0
        float ls = 0.0f;
        for (int u = 0; u < U; ++u) {
          w[u][r] = vq_exp2(w[u][r] - mn);            // masked: exp2(-inf) = 0
          ls += w[u][r];
        }
        l[r] = l[r] * alpha + ls;
        m[r] = mn;
      } else {
        for (int u = 0; u < U; ++u) {
          w[u][r] = 0.0f;
        }
      }
      for (int c = 0; c < NC; ++c) {
        acc[r][c] *= alpha;
        acc2[r % (VPARTS == 2 ? QB : 1)][c % VP2] *= alpha;
      }
    }
