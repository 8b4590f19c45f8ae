// tc_two_signs.cuh's k-step ks with the projected query's register fragment qb2 (tc_two_setup.cuh).
          const int kq = ks % (MK == 3 ? KS : 1);
          vq_mma(sc2[nt], qb2[kq][0], 0u, qb2[kq][1], 0u, vq_perm(e0, e1, 0x5410u), vq_perm(e2, e3, 0x5410u));
