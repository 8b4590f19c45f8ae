// tc_loop.cuh's end: the warps' states merged through threadgroup memory into sacc, sml (window split: tc_window.h).
  SHARED(float, swo, NW * QB * D);
  SHARED(float, swm, NW * 4);
  SHARED(float, swl, NW * 4);
  SHARED(float, sacc, QB * D);
  SHARED(float, sml, 2 * QB);
  if (is_win) {
#include "tc_window.h"
  } else {
  // -- this warp's state: l over a row's 4 lanes tig; O^T's two parts (columns n, n + 4: lanes tig, tig ^ 2)
  //    summed and scaled back; then the warps merged through threadgroup memory
  l_a += SHFL_XOR(l_a, 1);
  l_a += SHFL_XOR(l_a, 2);
  const float uv = (fv == 0.0f) ? 0.0f : (1.0f / fv) * (1.0f / ftv);   // fv == 0: no chunk, O = 0
  for (int mt = 0; mt < MT; ++mt) {
    for (int i = 0; i < 4; ++i) {
      o[mt][i] = (o[mt][i] + SHFL_XOR(o[mt][i], 2)) * uv;
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
        }
      }
    }
  }
  }
  BARRIER();
  VQ_COLD
  for (int i = tid; i < QB * D; i += NT) {
    float y = 0.0f;
    for (int w = 0; w < NW; ++w) {
      y += swo[w * QB * D + i];
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
