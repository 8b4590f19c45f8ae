// combine_rows_strided.h's (c): each row's splits' value rows, weighted, summed per coordinate into cy (and cy2).
  // (c) the weighted value sums: CNT >= D: thread CT takes coordinate CT % D and every CG-th split from CT / D
  //     (partials summed in order below); CNT < D: coordinates CT, CT + CNT, ... and every split
  constexpr int CG = (CNT >= D) ? CNT / D : 1;
  constexpr int CC = (CNT >= D) ? 1 : D / CNT;
  const int gi = (CNT >= D) ? CT / D : 0;
  for (int k = 0; k < CC; ++k) {
    const int c = (CNT >= D) ? CT % D : CT + k * CNT;
    float y[CQB];
    float y2[CQB];
    for (int r = 0; r < CQB; ++r) {
      y[r] = 0.0f;
      y2[r] = 0.0f;
    }
    if (gi < CG) {
      for (int s2 = gi; s2 < S; s2 += CG) {
        for (int r = 0; r < CQB; ++r) {
          if (r < NR) {
            const int64_t row = (crow0 + r) * (S + 1) + s2;
            const float ms = o_ml[row * 2];
            const float w = (ms == NEG_INF) ? 0.0f : vq_exp2(ms - me[r]);
            y[r] += o_acc[row * VPARTS * D + c] * w;
            if (VPARTS == 2) {
              y2[r] += o_acc[row * VPARTS * D + D + c] * w;
            }
          }
        }
      }
    }
    for (int r = 0; r < CQB; ++r) {
      if (CG == 1) {
        cy[r * D + c] = y[r];
        if (VPARTS == 2) {
          cy2[r * D + c] = y2[r];
        }
      } else if (gi < CG) {
        cpart[((r * VPARTS) * CG + gi) * D + c] = y[r];
        if (VPARTS == 2) {
          cpart[((r * VPARTS + 1) * CG + gi) * D + c] = y2[r];
        }
      }
    }
  }
  if (CG > 1) {
    BARRIER();
    VQ_COLD
    for (int i = CT; i < CQB * D; i += CNT) {
      const int r = i / D;
      const int c = i % D;
      float y = 0.0f;
      float y2 = 0.0f;
      for (int q2 = 0; q2 < CG; ++q2) {
        y += cpart[((r * VPARTS) * CG + q2) * D + c];
        if (VPARTS == 2) {
          y2 += cpart[((r * VPARTS + 1) * CG + q2) * D + c];
        }
      }
      cy[i] = y;
      if (VPARTS == 2) {
        cy2[i] = y2;
      }
    }
  }
  BARRIER();
