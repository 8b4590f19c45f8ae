      // the second stream (tc_two_setup.cuh): its codes in its own table, into the same scores (a coordinate's
      // two entries add before the norm multiplies them: spec/methods/turboquant_rvq.md's decode)
      if (MK == 1) {
        for (int ks = 0; ks < KS; ++ks) {
          const uint32_t w = kwc2[nt][(4 * KB2 * ks) / 32] >> ((4 * KB2 * ks) % 32);
          const uint32_t e0 = SHFL_IDX(tabk2, w);
          const uint32_t e1 = SHFL_IDX(tabk2, w >> KB2);
          const uint32_t e2 = SHFL_IDX(tabk2, w >> (2 * KB2));
          const uint32_t e3 = SHFL_IDX(tabk2, w >> (3 * KB2));
          vq_mma(sc[nt], qa[ks][0], 0u, qa[ks][1], 0u, vq_perm(e0, e1, 0x5410u), vq_perm(e2, e3, 0x5410u));
          vq_mma(sc[nt], qa[ks][0], 0u, qa[ks][1], 0u, vq_perm(e0, e1, 0x7632u), vq_perm(e2, e3, 0x7632u));
        }
      }
      // prod: the QJL signs against the projected query into sc2 (tc_two_xa.cuh adds them with their factor); the
      // signs are exact in float16 (no lo parts), so each k-step is one mma
      if (MK == 3) {
        for (int i = 0; i < 4; ++i) {
          sc2[nt][i] = 0.0f;
        }
        for (int ks = 0; ks < KS; ++ks) {
          const uint32_t w = kwc2[nt][(4 * KB2 * ks) / 32] >> ((4 * KB2 * ks) % 32);
          const uint32_t e0 = SHFL_IDX(tabk2, w);
          const uint32_t e1 = SHFL_IDX(tabk2, w >> KB2);
          const uint32_t e2 = SHFL_IDX(tabk2, w >> (2 * KB2));
          const uint32_t e3 = SHFL_IDX(tabk2, w >> (3 * KB2));
          const int kq = ks % (MK == 3 ? KS : 1);
          vq_mma(sc2[nt], qb2[kq][0], 0u, qb2[kq][1], 0u, vq_perm(e0, e1, 0x5410u), vq_perm(e2, e3, 0x5410u));
        }
      }
