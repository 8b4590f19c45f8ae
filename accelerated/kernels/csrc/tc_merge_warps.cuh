// tc_loop_merge.cuh's state of a warp of the mma loop (m_a, l_a, o) written to swo / swm / swl, scaled to the
// maximum over the warps (tc_mixed_merge.cuh shares it).
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
