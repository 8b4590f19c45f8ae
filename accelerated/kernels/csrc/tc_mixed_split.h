// Split S - 1 of a MIXED partial (attention_source.MIXED_WINDOWS, HASWIN 3: the values have an exact window, the keys
// none) on the tensor-core kernel of turboquant keys and KIVI values (tc_mixed_loop.cuh): tokens xt0 .. xt1 - 1, the
// rows this launch's append encodes and the values' window rows beside the keys' records. Few tokens, some exact, so
// scalar arithmetic, laid out as tc_window.h's: warp w takes tokens w, w + NW, ..., lane l coordinates l + 32 j. Keys
// from their codes in the rotated domain of sq (the encoded splits' queries); values from their KIVI records below QV,
// exact past it (from the chunk vx where this launch's append writes the window's row: partial_loop.h reads them so).
    constexpr int WJ = D / 32;
    float wm[QB];
    float wl[QB];
    float wo[QB][WJ];
    for (int r = 0; r < QB; ++r) {
      wm[r] = NEG_INF;
      wl[r] = 0.0f;
      for (int j = 0; j < WJ; ++j) {
        wo[r][j] = 0.0f;
      }
    }
    const int64_t vgb = (int64_t)b * vgs_strides[0] + (int64_t)h * vgs_strides[1];
    for (int tt = xt0 + warp; tt < xt1; tt += NW) {
      const DEVICE uint32_t* krow = kc1 + (int64_t)b * kc1_strides[0] + (int64_t)h * kc1_strides[1]
                                    + (int64_t)tt * kc1_strides[2];
      const float kn = ks0[kso + (int64_t)tt * ks0_strides[2]];
      const bool vex = tt >= QV;
      const int vwr = tt - QV;
      const int vq_nw = vwr - (RV - VQ_TNEW);
      const bool vq_new = APPEND && vex && vq_nw >= 0;
      const int64_t vo = vq_new ? (int64_t)b * vx_strides[0] + (int64_t)h * vx_strides[1] + (int64_t)vq_nw * vx_strides[2]
                                : (int64_t)b * vw_strides[0] + (int64_t)h * vw_strides[1] + (int64_t)vwr * vw_strides[2];
      const DEVICE uint32_t* vrow = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1]
                                    + (int64_t)(vex ? 0 : tt) * vc1_strides[2];
      float kv[WJ];
      float vv[WJ];
      for (int j = 0; j < WJ; ++j) {
        const int c = lane + 32 * j;
        kv[j] = VQ_LOOKUP(rk1, vq_code<KB1>(krow, c));      // (every lane: the lookup shuffles)
        if (vex) {
          vv[j] = vq_new ? static_cast<float>(vx[vo + (int64_t)c * vx_strides[3]])
                         : static_cast<float>(vw[vo + (int64_t)c * vw_strides[3]]);
        } else {
          const int64_t gi = vgb + (int64_t)tt * vgs_strides[2] + (int64_t)(c / VG) * vgs_strides[3];
          const float x = (float)vq_code<VB1>(vrow, c) * static_cast<float>(vgs[gi]);
          vv[j] = x + static_cast<float>(vgz[gi]);
        }
      }
      for (int r = 0; r < QB; ++r) {
        float dot = 0.0f;
        for (int j = 0; j < WJ; ++j) {
          dot += sq[r * D + lane + 32 * j] * kv[j];
        }
        for (int o2 = 16; o2 > 0; o2 >>= 1) {
          dot += SHFL_XOR(dot, o2);
        }
        dot = dot * kn;
        if (qg * QB + r < nq && (!CAUSAL || tt <= qpos[r])) {
          const float mn = vq_max(wm[r], dot);
          const float al = (wm[r] == NEG_INF) ? 0.0f : vq_exp2(wm[r] - mn);
          const float p = vq_exp2(dot - mn);
          wl[r] = wl[r] * al + p;
          for (int j = 0; j < WJ; ++j) {
            wo[r][j] = wo[r][j] * al + p * vv[j];
          }
          wm[r] = mn;
        }
      }
    }
#include "tc_window_end.h"
