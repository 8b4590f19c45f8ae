// tc_kivi_loop.cuh's value sums of one chunk: O^T += V'^T P'^T, V' = (s code + z) fv dequantized into A, P' = p 2^10.
#define VQ_TC_PSCALE ftv
#include "tc_values_p.cuh"
    // m-tile mt: coordinates g * D / 8 + mt (rows g) and + D / 16 (rows g + 8), tokens as tc_loop_values.cuh's;
    // each value split in hi and lo parts (A taken twice)
    float vs[4];
    float vz[4];
    for (int x = 0; x < 4; ++x) {
      vs[x] = vsc[x] * fv;
      vz[x] = vzc[x] * fv;
    }
    for (int mt = 0; mt < MT; ++mt) {
#include "tc_values_at.cuh"
      float ea[4];
      float fb[4];
      for (int x = 0; x < 4; ++x) {
        ea[x] = (float)((vwc[x][wa] >> sa) & VMASK) * vs[x] + vz[x];
        fb[x] = (float)((vwc[x][wb] >> sb) & VMASK) * vs[x] + vz[x];
      }
#include "tc_values_hilo.cuh"
    }
