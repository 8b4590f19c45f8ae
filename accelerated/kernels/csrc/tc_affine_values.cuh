// tc_affine_loop.cuh's value sums of one chunk: O^T += V'^T P'^T, V' = T(T(c s) + b) fv dequantized in A, P' = p 2^10.
#define VQ_TC_PSCALE ftv
#include "tc_values_p.cuh"
    // m-tile mt: coordinates g * D / 8 + mt (rows g) and + D / 16 (rows g + 8), tokens as tc_loop_values.cuh's
    for (int mt = 0; mt < MT; ++mt) {
#include "tc_values_at.cuh"
      float ea[4];
      float fb[4];
      for (int x = 0; x < 4; ++x) {
        const float xa_ = (float)((vwc[x][wa] >> sa) & VMASK) * vsc[x];
        const float xb_ = (float)((vwc[x][wb] >> sb) & VMASK) * vsc[x];
        ea[x] = vq_round_to(vgs[0], vq_round_to(vgs[0], xa_) + vzc[x]) * fv;
        fb[x] = vq_round_to(vgs[0], vq_round_to(vgs[0], xb_) + vzc[x]) * fv;
      }
      if (VLO) {
#include "tc_values_hilo.cuh"
      } else {
        vq_mma(o[mt], vq_h2(ea[0], ea[1]), vq_h2(fb[0], fb[1]), vq_h2(ea[2], ea[3]), vq_h2(fb[2], fb[3]), p0, p1);
      }
    }
