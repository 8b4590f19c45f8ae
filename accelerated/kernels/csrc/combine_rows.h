// Rows CR0 .. CR1 - 1 of KV head h (the fused scalar combine): merge the S encoded splits' partials, the values'
// inverse rotation once, the window's partial, the rows in the queries' dtype. Threads CT = 0 .. CNT - 1 share
// the D coordinates; cy, cy2: D floats of threadgroup memory each.

  for (int r = CR0; r < CR1; ++r) {
    const int64_t row0 = (((int64_t)b * hkv + h) * nq + r) * (S + 1);
    float me = NEG_INF;
    for (int s2 = 0; s2 < S; ++s2) {
      me = vq_max(me, o_ml[(row0 + s2) * 2]);
    }
    float le = 0.0f;
    for (int s2 = 0; s2 < S; ++s2) {
      const float ms = o_ml[(row0 + s2) * 2];
      le += o_ml[(row0 + s2) * 2 + 1] * ((ms == NEG_INF) ? 0.0f : vq_exp2(ms - me));
    }
    for (int c = CT; c < D; c += CNT) {
      float y = 0.0f;
      float y2 = 0.0f;
      for (int s2 = 0; s2 < S; ++s2) {
        const float ms = o_ml[(row0 + s2) * 2];
        const float w = (ms == NEG_INF) ? 0.0f : vq_exp2(ms - me);
        y += o_acc[(row0 + s2) * VPARTS * D + c] * w;
        if (VPARTS == 2) {
          y2 += o_acc[(row0 + s2) * VPARTS * D + D + c] * w;
        }
      }
      cy[c] = y;
      if (VPARTS == 2) {
        cy2[c] = y2;
      }
    }
    BARRIER();
#include "combine_row_end.h"
    BARRIER();                             // cy is the next row's
  }
