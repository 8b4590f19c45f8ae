// The tensor-core kernel's fused combine: all NR rows at once, the splits strided over the threads.
// CR0, CR1, CT, CNT, b, h, hkv, nq, S from the includer (partial_combine.h).
      constexpr int CQB = QB;
      SHARED(float, cred, CQB * CNT);
      SHARED(float, cpart, (CNT > D) ? CQB * VPARTS * CNT : 1);

  // (the tensor-core kernel's: all NR rows at once, the splits strided over the threads. Measured with it on the
  // H200; the scalar kernels keep COMBINE_ROWS, which measured faster there: docs/decode-step-analysis.md)
  const int NR = CR1 - CR0;
  const int64_t crow0 = ((int64_t)b * hkv + h) * nq + CR0;     // row CR0 + r: (crow0 + r) * (S + 1)
  // (a) each row's max over the splits: per thread, then a tree over the CNT threads (a power of two)
  for (int r = 0; r < CQB; ++r) {
    float pm = NEG_INF;
    if (r < NR) {
      for (int s2 = CT; s2 < S; s2 += CNT) {
        pm = vq_max(pm, o_ml[((crow0 + r) * (S + 1) + s2) * 2]);
      }
    }
    cred[r * CNT + CT] = pm;
  }
  VQ_COLD
  for (int half = CNT / 2; half > 0; half >>= 1) {
    BARRIER();
    VQ_COLD
    for (int i = CT; i < CQB * half; i += CNT) {
      const int o = (i / half) * CNT + i % half;
      cred[o] = vq_max(cred[o], cred[o + half]);
    }
  }
  BARRIER();
  float me[CQB];
  for (int r = 0; r < CQB; ++r) {
    me[r] = cred[r * CNT];
  }
  BARRIER();
  // (b) each row's sum of the splits' sums, rescaled to its max, likewise
  for (int r = 0; r < CQB; ++r) {
    float pl = 0.0f;
    if (r < NR) {
      for (int s2 = CT; s2 < S; s2 += CNT) {
        const int64_t o = ((crow0 + r) * (S + 1) + s2) * 2;
        const float ms = o_ml[o];
        pl += (ms == NEG_INF) ? 0.0f : o_ml[o + 1] * vq_exp2(ms - me[r]);
      }
    }
    cred[r * CNT + CT] = pl;
  }
  VQ_COLD
  for (int half = CNT / 2; half > 0; half >>= 1) {
    BARRIER();
    VQ_COLD
    for (int i = CT; i < CQB * half; i += CNT) {
      const int o = (i / half) * CNT + i % half;
      cred[o] = cred[o] + cred[o + half];
    }
  }
  BARRIER();
  float le[CQB];
  for (int r = 0; r < CQB; ++r) {
    le[r] = cred[r * CNT];
  }
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
  if (VROT) {
    // inverse RHT of every row: H, s_d, signs (rotation.md); turboquant_prod first adds tau's inverse of the
    // sketch part
    for (int pass = (VPARTS == 2 ? 0 : 1); pass < 2; ++pass) {
      VQ_COLD
      for (int hh = 1; hh < D; hh <<= 1) {
        vq_butterfly_stage<D>((pass == 0) ? cy2 : cy, NR, hh, CT, CNT);
        BARRIER();
      }
      VQ_COLD
      for (int i = CT; i < NR * D; i += CNT) {
        const int c = i % D;
        if (pass == 0) {
          cy[i] = cy[i] + cy2[i] * f_k[0] * f_vtau[h * D + c];
        } else {
          cy[i] = cy[i] * f_k[0] * f_vsig[h * D + c];
        }
      }
      BARRIER();
    }
  }
  // (d) the window's partial (split S), the division by the total sum, the output rows in the queries' dtype
  VQ_COLD
  for (int i = CT; i < NR * D; i += CNT) {
    const int r = i / D;
    const int c = i % D;
    const int64_t roww = (crow0 + r) * (S + 1) + S;
    float mer = NEG_INF;
    float ler = 0.0f;
    for (int r2 = 0; r2 < CQB; ++r2) {
      mer = (r2 == r) ? me[r2] : mer;
      ler = (r2 == r) ? le[r2] : ler;
    }
    const float mw = o_ml[roww * 2];
    const float lw = o_ml[roww * 2 + 1];
    const float mt = vq_max(mer, mw);
    const float we = (mer == NEG_INF) ? 0.0f : vq_exp2(mer - mt);
    const float ww = (mw == NEG_INF) ? 0.0f : vq_exp2(mw - mt);
    const int rr = CR0 + r;
    const int head = h * rep + rr / L;
    const int pos = rr % L;
    const float o = (cy[i] * we + o_acc[roww * VPARTS * D + c] * ww) / (ler * we + lw * ww);
    out[(((int64_t)b * hq + head) * L + pos) * D + c] = static_cast<OT>(o);
  }
