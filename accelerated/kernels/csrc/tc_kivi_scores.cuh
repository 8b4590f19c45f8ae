// tc_kivi_loop.cuh's scores of one chunk: the query fragments rebuilt for a new key group, S on tensor cores, masked.
    const int tb = ta + 16 * j;
    if (VQ_KGROW(tb) != kgrp) {           // warp-uniform: the chunk's tokens lie in one group (ragged: from the
      kgrp = VQ_KGROW(tb);                // row's phase)
      const int64_t go = kgo + (int64_t)kgrp * kgs_strides[2];
      // a = q s[grp] over this lane's coordinates tig * D / 4 + 4 ks + e; zq = q . z[grp] summed over the row's
      // lanes tig; a power of two per row puts its largest |a| near 2^11 (lanes g and g ^ 4 find the same)
      float av[KS][4];
      float mx = 0.0f;
      float zs = 0.0f;
      for (int ks = 0; ks < KS; ++ks) {
        for (int e = 0; e < 4; ++e) {
          const int c = tig * (D / 4) + 4 * ks + e;
          const float qv = has_a ? sq[ra * D + c] : 0.0f;
          av[ks][e] = qv * static_cast<float>(kgs[go + (int64_t)c * kgs_strides[3]]);
          zs += qv * static_cast<float>(kgz[go + (int64_t)c * kgs_strides[3]]);
          mx = vq_max(mx, fabsf(av[ks][e]));
        }
      }
      mx = vq_max(mx, SHFL_XOR(mx, 1));
      mx = vq_max(mx, SHFL_XOR(mx, 2));
      zs += SHFL_XOR(zs, 1);
      zs += SHFL_XOR(zs, 2);
      const float fq = vq_pow2_for(mx, 11);
      uka = 1.0f / fq;                    // exact: a power of two
      zq = zs;
      for (int ks = 0; ks < KS; ++ks) {
        for (int jp = 0; jp < 2; ++jp) {
          float x0 = av[ks][2 * jp] * fq;
          float x1 = av[ks][2 * jp + 1] * fq;
          if (part == 1) {
            x0 -= vq_hround(x0);
            x1 -= vq_hround(x1);
          }
          qa[ks][jp] = vq_h2(x0, x1);
        }
      }
    }
    // -- S = A C^T: codes exact in float16, so one mma per k-step (the query's hi and lo parts are in M)
    float sc[2][4];
    for (int nt = 0; nt < 2; ++nt) {
      for (int i = 0; i < 4; ++i) {
        sc[nt][i] = 0.0f;
      }
      for (int ks = 0; ks < KS; ++ks) {
        const uint32_t w = kwc[nt][(4 * KB1 * ks) / 32] >> ((4 * KB1 * ks) % 32);
        const uint32_t e0 = SHFL_IDX(tabk, w);
        const uint32_t e1 = SHFL_IDX(tabk, w >> KB1);
        const uint32_t e2 = SHFL_IDX(tabk, w >> (2 * KB1));
        const uint32_t e3 = SHFL_IDX(tabk, w >> (3 * KB1));
        vq_mma(sc[nt], qa[ks][0], 0u, qa[ks][1], 0u, vq_perm(e0, e1, 0x5410u), vq_perm(e2, e3, 0x5410u));
      }
    }
    // -- a row's two parts (lanes g, g ^ 4) summed and scaled back, plus the zero term; masked (and below t0): -inf
    float xa[4];
    for (int x = 0; x < 4; ++x) {
      const int t = tb + 8 * (x >> 1) + 2 * tig + (x & 1);
      const float ya = sc[x >> 1][x & 1];
      const float za = ya + SHFL_XOR(ya, 16);
      xa[x] = (t >= t0 && t < t1 && (!CAUSAL || t <= qpa)) ? za * uka + zq : NEG_INF;
    }
