      // the second stream (tc_two_setup.cuh): its codes in its own table, into the same scores (a coordinate's
      // two entries add before the norm multiplies them: spec/methods/turboquant_rvq.md's decode)
      if (MK == 1) {
        for (int ks = 0; ks < KS; ++ks) {
#include "tc_two_entries.cuh"
          vq_mma(sc[nt], qa[ks][0], 0u, qa[ks][1], 0u, vq_perm(e0, e1, 0x5410u), vq_perm(e2, e3, 0x5410u));
          vq_mma(sc[nt], qa[ks][0], 0u, qa[ks][1], 0u, vq_perm(e0, e1, 0x7632u), vq_perm(e2, e3, 0x7632u));
        }
      }
#include "tc_two_signs.cuh"
