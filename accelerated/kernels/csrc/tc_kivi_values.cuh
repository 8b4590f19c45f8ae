// tc_kivi_loop.cuh's value sums of one chunk: O^T += V'^T P'^T, V' = (s code + z) fv dequantized into A, P' = p 2^10.
    float ua[4];
    for (int x = 0; x < 4; ++x) {
      ua[x] = pa[x] * ftv;
      if (part == 1) {
        ua[x] -= vq_hround(ua[x]);
      }
    }
    const uint32_t p0 = vq_h2(ua[0], ua[1]);
    const uint32_t p1 = vq_h2(ua[2], ua[3]);
    // m-tile mt: coordinates g * D / 8 + mt (rows g) and + D / 16 (rows g + 8), tokens as tc_loop_values.cuh's;
    // each value split in hi and lo parts (A taken twice)
    float vs[4];
    float vz[4];
    for (int x = 0; x < 4; ++x) {
      vs[x] = vsc[x] * fv;
      vz[x] = vzc[x] * fv;
    }
    for (int mt = 0; mt < MT; ++mt) {
      const int wa = VWHOLE ? (VB1 * mt) / 32 : 0;
      const int sa = VWHOLE ? (VB1 * mt) % 32 : vsh + VB1 * mt;
      const int wb = VWHOLE ? (VB1 * (D / 16 + mt)) / 32 : 0;
      const int sb = VWHOLE ? (VB1 * (D / 16 + mt)) % 32 : vsh + VB1 * (D / 16 + mt);
      float ea[4];
      float fb[4];
      for (int x = 0; x < 4; ++x) {
        ea[x] = (float)((vwc[x][wa] >> sa) & VMASK) * vs[x] + vz[x];
        fb[x] = (float)((vwc[x][wb] >> sb) & VMASK) * vs[x] + vz[x];
      }
#include "tc_values_hilo.cuh"
    }
