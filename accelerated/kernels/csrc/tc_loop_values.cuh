// tc_loop.cuh's value sums of one chunk: O^T += V^T P'^T on tensor cores (P' = p * value norm * fv).
    // -- P' = p * value norm * fv, its part of the row as the B operand (k: tokens 2 tig, 2 tig + 1 / + 8, n: g)
#define VQ_TC_PSCALE vnc[x] * fv
#include "tc_values_p.cuh"
    // -- value sums O^T += V^T P'^T: m-tile mt has coordinates g * D / 8 + mt (rows g) and + D / 16 (rows g + 8)
    //    of tokens 2 tig, 2 tig + 1 (a0, a1) and 2 tig + 8, 2 tig + 9 (a2, a3)
#include "tc_ventries.cuh"
    for (int mt = 0; mt < MT; ++mt) {
#include VQ_TC_VALUES
      vq_mma(o[mt], vq_perm(e0, e1, 0x5410u), vq_perm(f0, f1, 0x5410u), vq_perm(e2, e3, 0x5410u),
             vq_perm(f2, f3, 0x5410u), p0, p1);
      vq_mma(o[mt], vq_perm(e0, e1, 0x7632u), vq_perm(f0, f1, 0x7632u), vq_perm(e2, e3, 0x7632u),
             vq_perm(f2, f3, 0x7632u), p0, p1);
#include VQ_TC_VALUES2
    }
#undef VQ_TC_VENTRIES
