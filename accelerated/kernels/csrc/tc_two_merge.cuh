// tc_loop_merge.cuh with VPARTS value parts a row (prod values: o2, the sketch-domain sums, as part 1): swo holds part
// p of warp w's row r at p * SWP + (w * QB + r) * D. The window split writes part 0 only: the combine reads no
// sketch part of split S.
  SHARED(float, swo, NW * QB * VPARTS * D);
  SHARED(float, swm, NW * 4);
  SHARED(float, swl, NW * 4);
  SHARED(float, sacc, QB * VPARTS * D);
  SHARED(float, sml, 2 * QB);
  constexpr int SWP = NW * QB * D;        // one part of swo
  if (is_win) {
#include "tc_window.h"
  } else {
  // -- this warp's state: l over a row's 4 lanes tig; O^T's two parts (columns n, n + 4: lanes tig, tig ^ 2)
  //    summed and scaled back (o2: its fv2, the signs unscaled); then the warps merged through threadgroup memory
  l_a += SHFL_XOR(l_a, 1);
  l_a += SHFL_XOR(l_a, 2);
  const float uv = (fv == 0.0f) ? 0.0f : (1.0f / fv) * (1.0f / ftv);   // fv == 0: no chunk, O = 0
  const float uv2 = (fv2 == 0.0f) ? 0.0f : 1.0f / fv2;
  for (int mt = 0; mt < MT; ++mt) {
    const int m2 = mt % (MV == 3 ? MT : 1);
    for (int i = 0; i < 4; ++i) {
      o[mt][i] = (o[mt][i] + SHFL_XOR(o[mt][i], 2)) * uv;
      if (MV == 3) {
        o2[m2][i] = (o2[m2][i] + SHFL_XOR(o2[m2][i], 2)) * uv2;
      }
    }
  }
  if (tig == 0 && g < 4) {
    swm[warp * 4 + g] = m_a;
    swl[warp * 4 + g] = l_a;
  }
  BARRIER();
  if (tig < 2) {
    for (int e = 0; e < 2; ++e) {
      const int r = 2 * tig + e;
      if (r < QB) {
        float mx = NEG_INF;
        for (int w = 0; w < NW; ++w) {
          mx = vq_max(mx, swm[w * 4 + r]);
        }
        const float mw = swm[warp * 4 + r];
        const float f = (mw == NEG_INF) ? 0.0f : vq_exp2(mw - mx);
        for (int mt = 0; mt < MT; ++mt) {
          swo[(warp * QB + r) * D + (D / 8) * g + mt] = o[mt][e] * f;
          swo[(warp * QB + r) * D + (D / 8) * g + D / 16 + mt] = o[mt][2 + e] * f;
          if (VPARTS == 2) {
            swo[SWP + (warp * QB + r) * D + (D / 8) * g + mt] = o2[mt % (MV == 3 ? MT : 1)][e] * f;
            swo[SWP + (warp * QB + r) * D + (D / 8) * g + D / 16 + mt] = o2[mt % (MV == 3 ? MT : 1)][2 + e] * f;
          }
        }
      }
    }
  }
  }
  BARRIER();
  VQ_COLD
  for (int i = tid; i < QB * VPARTS * D; i += NT) {
    const int at = ((i / D) % VPARTS) * SWP + (i / (VPARTS * D)) * D + i % D;      // (part, row, coordinate)
    float y = 0.0f;
    for (int w = 0; w < NW; ++w) {
      y += swo[at + w * QB * D];
    }
    sacc[i] = y;
  }
  for (int r = tid; r < QB; r += NT) {
    float mx = NEG_INF;
    for (int w = 0; w < NW; ++w) {
      mx = vq_max(mx, swm[w * 4 + r]);
    }
    float y = 0.0f;
    for (int w = 0; w < NW; ++w) {
      const float mw = swm[w * 4 + r];
      y += (mw == NEG_INF) ? 0.0f : swl[w * 4 + r] * vq_exp2(mw - mx);
    }
    sml[2 * r] = mx;
    sml[2 * r + 1] = y;
  }
  BARRIER();
