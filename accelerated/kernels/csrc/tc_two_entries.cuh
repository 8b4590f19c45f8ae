// The second stream's table entries e0 .. e3 of key slot nt's k-step ks (tc_two_scores.cuh, tc_two_signs.cuh).
          const uint32_t w = kwc2[nt][(4 * KB2 * ks) / 32] >> ((4 * KB2 * ks) % 32);
          const uint32_t e0 = SHFL_IDX(tabk2, w);
          const uint32_t e1 = SHFL_IDX(tabk2, w >> KB2);
          const uint32_t e2 = SHFL_IDX(tabk2, w >> (2 * KB2));
          const uint32_t e3 = SHFL_IDX(tabk2, w >> (3 * KB2));
