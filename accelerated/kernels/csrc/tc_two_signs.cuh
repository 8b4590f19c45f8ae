// prod keys' QJL signs against the projected query into sc2 (tc_two_xa.cuh adds them with their factor); the signs are
// exact in float16 (no lo parts), so each k-step is one mma, its A operand VQ_TC_SIGNS's: tc_two_qb2.cuh (the
// register fragment qb2) or tc_prod3_signs.cuh (made from sq2 at each k-step).
      if (MK == 3) {
        for (int i = 0; i < 4; ++i) {
          sc2[nt][i] = 0.0f;
        }
        for (int ks = 0; ks < KS; ++ks) {
#include "tc_two_entries.cuh"
#include VQ_TC_SIGNS
        }
      }
