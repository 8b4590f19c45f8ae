// partial_loop.h's keys: the U tokens' key coordinates kv (kv2) and factors, then their partial dot products.
    // -- keys: partial dot products of this lane's coordinates, and each token's factors
    float part[U][QB];
    float part2[U][KP2];
    float kfac[U];
    float kfac2[U];
    for (int u = 0; u < U; ++u) {
      const int tt = tu[u];
      float kv[NC];
      float kv2[KPARTS == 2 ? NC : 1];
      kfac[u] = 1.0f;
      kfac2[u] = 0.0f;
#if VQ_MIXED
#if VQ_RAGGED
      const bool kex = is_win || tt >= VQ_QKR;    // (ragged KIVI keys, VQ_RKEYS: past the row's own records, QKR)
#else
      const bool kex = is_win || tt >= QK;        // exact: the window split, or split S - 1 past the keys' records
#endif
      const int kwr = is_win ? tt + KWO : tt - QK;    // its row of the keys' window
#else
      const bool kex = is_win;
      const int kwr = tt;
#endif
      if (!is_win) {      // (every lane of an encoded split: the code lookups shuffle)
        if (KPRE) {
          kfac[u] = pks0[u % KU];
          if (MK == 2) {
            const float a1 = pks1[u % KU];
            kfac[u] = (a1 > 0.0f) ? (kfac[u] * f_k[0]) / a1 : 0.0f;   // g = (n s_d) / ip
          }
          for (int k = 0; k < NCH; ++k) {
            const int ch = lp + k * P;
            float v8[8];
            VQ_CHUNK_W(KB1, pk1[u % KU][k % KN], ch, rk1, v8);
            if (MK == 1) {
              float w8[8];
              VQ_CHUNK_W(KB2, pk2[u % KU][k % KN], ch, rk2, w8);
              for (int j = 0; j < 8; ++j) {
                v8[j] += w8[j];
              }
            }
            for (int j = 0; j < 8; ++j) {
              kv[k * 8 + j] = v8[j];
            }
          }
        } else {
#include "partial_loop_keys_rows.h"
        }
      }
#include "partial_loop_keys_exact.h"
      for (int r = 0; r < QB; ++r) {
        float a = 0.0f;
        float a2 = 0.0f;
        for (int c = 0; c < NC; ++c) {
          a += qr[r][c] * kv[c];
          if (KPARTS == 2) {
            a2 += qr2[r % KP2][c % (KPARTS == 2 ? NC : 1)] * kv2[c % (KPARTS == 2 ? NC : 1)];
          }
        }
        part[u][r] = a;
        part2[u][r % KP2] = a2;
      }
    }
