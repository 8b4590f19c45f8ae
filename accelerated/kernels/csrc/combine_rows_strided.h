// The tensor-core kernel's fused combine: all NR rows at once, the splits strided over the threads.
// CR0, CR1, CT, CNT, b, h, hkv, nq, S from the includer (partial_combine.h).
      constexpr int CQB = QB;
      SHARED(float, cred, CQB * CNT);
      SHARED(float, cpart, (CNT > D) ? CQB * VPARTS * CNT : 1);

  // (the tensor-core kernel's: all NR rows at once, the splits strided over the threads. Measured with it on the
  // H200; the scalar kernels keep COMBINE_ROWS, which measured faster there: docs/decode-step-analysis.md)
  const int NR = CR1 - CR0;
  const int64_t crow0 = ((int64_t)b * hkv + h) * nq + CR0;     // row CR0 + r: (crow0 + r) * (S + 1)
#include "combine_strided_stats.h"
#include "combine_strided_values.h"
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
