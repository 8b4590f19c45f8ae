// partial_loop.h's values: the U tokens' value coordinates vv (vv2) and factors, weighted into acc (acc2).
    // -- values: this lane's coordinates (rotated domain for the rotation family), weighted. Unrolled on CUDA: left
    //    rolled (turboquant_prod's long body), tu[u] and w[u][r] went to local memory (an 80-byte stack frame)
    VQ_UNROLL
    for (int u = 0; u < U; ++u) {
      const int tt = tu[u];
      float vv[NC];
      float vv2[VP2];
      float vfac = 1.0f;
      float vfac2 = 0.0f;
#if VQ_MIXED
#if VQ_RAGGED
      const bool vex = is_win || tt >= QVR;       // (ragged: past the row's own records; window rows from QV on)
#else
      const bool vex = is_win || tt >= QV;        // exact: the window split, or split S - 1 past the values' records
#endif
      const int vwr = is_win ? tt + VWO : tt - QV;
#else
      const bool vex = is_win;
      const int vwr = tt;
#endif
      if (!is_win) {      // (every lane of an encoded split: the code lookups shuffle)
        if (VPRE) {
          vfac = pvs0[u % VU];
          if (MV == 2) {
            const float a1 = pvs1[u % VU];
            vfac = (a1 > 0.0f) ? (vfac * f_k[0]) / a1 : 0.0f;
          }
          if (MV == 3) {
            vfac2 = vfac * (pvs1[u % VU] * f_k[1]);
          }
          for (int k = 0; k < NCH; ++k) {
            const int ch = lp + k * P;
            float v8[8];
            VQ_CHUNK_W(VB1, pv1[u % VU][k % VN], ch, rv1, v8);
            if (MV == 1) {
              float w8[8];
              VQ_CHUNK_W(VB2, pv2[u % VU][k % VN], ch, rv2, w8);
              for (int j = 0; j < 8; ++j) {
                v8[j] += w8[j];
              }
            }
            if (MV == 3) {
              float w8[8];
              VQ_CHUNK_W(VB2, pv2[u % VU][k % VN], ch, rv2, w8);
              for (int j = 0; j < 8; ++j) {
                vv2[(k * 8 + j) % VP2] = w8[j];
              }
            }
            for (int j = 0; j < 8; ++j) {
              vv[k * 8 + j] = v8[j];
            }
          }
        } else {
#include "partial_loop_values_rows.h"
        }
      }
#include "partial_loop_values_exact.h"
      for (int r = 0; r < QB; ++r) {
        const float wv = is_win ? w[u][r] : w[u][r] * vfac;
        for (int c = 0; c < NC; ++c) {
          acc[r][c] += wv * vv[c];
        }
        if (VPARTS == 2 && !is_win) {
          const float wv2 = w[u][r] * vfac2;
          for (int c = 0; c < NC; ++c) {
            acc2[r % (VPARTS == 2 ? QB : 1)][c % VP2] += wv2 * vv2[c % VP2];
          }
        }
      }
    }
