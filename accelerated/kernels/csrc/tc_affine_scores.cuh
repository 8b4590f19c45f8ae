// tc_affine_loop.cuh's scores of one chunk: S = Q K^T with K dequantized into B, a row's two parts summed, masked.
    const int tb = t0 + 16 * j;
    // the chunk's power of two fk: its largest possible |x| (over the warp's tokens and groups) near 2^11
    float km = vq_max((float)KMASK * fabsf(ksc[0]) + fabsf(kzc[0]), (float)KMASK * fabsf(ksc[1]) + fabsf(kzc[1]));
    for (int o2 = 1; o2 < 32; o2 <<= 1) {
      km = vq_max(km, SHFL_XOR(km, o2));
    }
    const float fk = vq_pow2_for(km, 11);
    // -- S = Q K^T: n-tile nt is tokens tb + 8 nt + g (B column g); k-step ks this lane quarter's coordinates
    //    4 ks .. 4 ks + 3 (b0: the first two, b1: the last two), as the query fragments qa
    float sc[2][4];
    for (int nt = 0; nt < 2; ++nt) {
      for (int i = 0; i < 4; ++i) {
        sc[nt][i] = 0.0f;
      }
      for (int ks = 0; ks < KS; ++ks) {
        const uint32_t w = kwc[nt][(4 * KB1 * ks) / 32] >> ((4 * KB1 * ks) % 32);
        float e[4];
        for (int i = 0; i < 4; ++i) {
          const float x = (float)((w >> (KB1 * i)) & KMASK) * ksc[nt];
          e[i] = vq_round_to(kgs[0], vq_round_to(kgs[0], x) + kzc[nt]) * fk;
        }
        if (KLO) {
          const float h0 = vq_hround(e[0]), h1 = vq_hround(e[1]), h2 = vq_hround(e[2]), h3 = vq_hround(e[3]);
          vq_mma(sc[nt], qa[ks][0], 0u, qa[ks][1], 0u, vq_h2(h0, h1), vq_h2(h2, h3));
          vq_mma(sc[nt], qa[ks][0], 0u, qa[ks][1], 0u, vq_h2(e[0] - h0, e[1] - h1), vq_h2(e[2] - h2, e[3] - h3));
        } else {
          vq_mma(sc[nt], qa[ks][0], 0u, qa[ks][1], 0u, vq_h2(e[0], e[1]), vq_h2(e[2], e[3]));
        }
      }
    }
    // -- a row's two parts (lanes g, g ^ 4) summed and scaled back (exact: powers of two); masked: -inf
    const float uk = uka * (1.0f / fk);
    float xa[4];
    for (int x = 0; x < 4; ++x) {
      const int t = tb + 8 * (x >> 1) + 2 * tig + (x & 1);
      const float ya = sc[x >> 1][x & 1];
      const float za = ya + SHFL_XOR(ya, 16);
      xa[x] = (t < t1 && (!CAUSAL || t <= qpa)) ? za * uk : NEG_INF;
    }
