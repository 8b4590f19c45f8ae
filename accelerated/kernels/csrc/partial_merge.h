// Step 4 of the partial kernel's scalar loop (partial_loop.h): the token slots of each warp merged, then the warps.
  // 4. merge the token slots of each warp (xor over slots), then the warps (in shared memory, in order)
  for (int off = P; off < 32; off <<= 1) {
    for (int r = 0; r < QB; ++r) {
      const float mo = SHFL_XOR(m[r], off);
      const float lo = SHFL_XOR(l[r], off);
      const float mx = vq_max(m[r], mo);
      const float a = (m[r] == NEG_INF) ? 0.0f : vq_exp2(m[r] - mx);
      const float bo = (mo == NEG_INF) ? 0.0f : vq_exp2(mo - mx);
      l[r] = l[r] * a + lo * bo;
      m[r] = mx;
      for (int c = 0; c < NC; ++c) {
        acc[r][c] = acc[r][c] * a + SHFL_XOR(acc[r][c], off) * bo;
      }
      if (VPARTS == 2) {
        for (int c = 0; c < NC; ++c) {
          const int rr = r % (VPARTS == 2 ? QB : 1);
          const int cc = c % (VPARTS == 2 ? NC : 1);
          acc2[rr][cc] = acc2[rr][cc] * a + SHFL_XOR(acc2[rr][cc], off) * bo;
        }
      }
    }
  }
  SHARED(float, sacc, QB * VPARTS * D);
  SHARED(float, sml, 2 * QB);
  for (int w = 0; w < NW; ++w) {
    // read the running (m, l) of warps 0..w-1 before any lane of warp w overwrites them
    float a[QB];
    float bo[QB];
    for (int r = 0; r < QB; ++r) {
      a[r] = 1.0f;
      bo[r] = 0.0f;
      if (w > 0 && warp == w) {
        const float mo = sml[2 * r];
        const float mx = vq_max(m[r], mo);
        a[r] = (m[r] == NEG_INF) ? 0.0f : vq_exp2(m[r] - mx);
        bo[r] = (mo == NEG_INF) ? 0.0f : vq_exp2(mo - mx);
        l[r] = l[r] * a[r] + sml[2 * r + 1] * bo[r];
        m[r] = mx;
      }
    }
    BARRIER();
    if (warp == w && slot == 0) {
      for (int r = 0; r < QB; ++r) {
        for (int k = 0; k < NCH; ++k) {
          for (int j = 0; j < 8; ++j) {
            const int c = (lp + k * P) * 8 + j;
            const int o = (r * VPARTS) * D + c;
            sacc[o] = acc[r][k * 8 + j] * a[r] + (w > 0 ? sacc[o] * bo[r] : 0.0f);
            if (VPARTS == 2) {
              sacc[o + D] = acc2[r % (VPARTS == 2 ? QB : 1)][(k * 8 + j) % (VPARTS == 2 ? NC : 1)] * a[r]
                            + (w > 0 ? sacc[o + D] * bo[r] : 0.0f);
            }
          }
        }
        if (lp == 0) {
          sml[2 * r] = m[r];
          sml[2 * r + 1] = l[r];
        }
      }
    }
    BARRIER();
  }
