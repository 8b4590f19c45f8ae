// tc_two_signs.cuh's k-step ks for prod keys beside prod values with 3-bit codes (tc_prod3): the projected query's
// fragment made from sq2 at each k-step (its register copy, qb2, spilled beside the values' second accumulator and
// 3-bit raw words, nvcc sm_80 / sm_90).
          const int c = tig * (D / 4) + 4 * ks;      // (tc_two_setup.cuh's qb2[ks]: coordinates c .. c + 3)
          float y0 = has_a ? sq2[ra * D + c] * fqb : 0.0f;
          float y1 = has_a ? sq2[ra * D + c + 1] * fqb : 0.0f;
          float y2 = has_a ? sq2[ra * D + c + 2] * fqb : 0.0f;
          float y3 = has_a ? sq2[ra * D + c + 3] * fqb : 0.0f;
          if (part == 1) {
            y0 -= vq_hround(y0);
            y1 -= vq_hround(y1);
            y2 -= vq_hround(y2);
            y3 -= vq_hround(y3);
          }
          vq_mma(sc2[nt], vq_h2(y0, y1), 0u, vq_h2(y2, y3), 0u, vq_perm(e0, e1, 0x5410u), vq_perm(e2, e3, 0x5410u));
