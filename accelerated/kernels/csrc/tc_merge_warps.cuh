// tc_loop_merge.cuh's state of a warp of the mma loop (m_a, l_a, o) written to swo / swm / swl, scaled to the
// maximum over the warps (tc_mixed_merge.cuh and tc_two_merge.cuh share it). VQ_TC_O2 (tc_two_merge.cuh; undefined:
// 0): prod values' second accumulator o2 summed and scaled as o (its fv2, the signs unscaled), written as part 1.
  // -- this warp's state: l over a row's 4 lanes tig; O^T's two parts (columns n, n + 4: lanes tig, tig ^ 2)
  //    summed and scaled back; then the warps merged through threadgroup memory
  l_a += SHFL_XOR(l_a, 1);
  l_a += SHFL_XOR(l_a, 2);
  const float uv = (fv == 0.0f) ? 0.0f : (1.0f / fv) * (1.0f / ftv);   // fv == 0: no chunk, O = 0
#if VQ_TC_O2
  const float uv2 = (fv2 == 0.0f) ? 0.0f : 1.0f / fv2;
#endif
  for (int mt = 0; mt < MT; ++mt) {
#if VQ_TC_O2
    const int m2 = mt % (MV == 3 ? MT : 1);
#endif
    for (int i = 0; i < 4; ++i) {
      o[mt][i] = (o[mt][i] + SHFL_XOR(o[mt][i], 2)) * uv;
#if VQ_TC_O2
      if (MV == 3) {
        o2[m2][i] = (o2[m2][i] + SHFL_XOR(o2[m2][i], 2)) * uv2;
      }
#endif
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
#if VQ_TC_O2
          if (VPARTS == 2) {
            swo[SWP + (warp * QB + r) * D + (D / 8) * g + mt] = o2[mt % (MV == 3 ? MT : 1)][e] * f;
            swo[SWP + (warp * QB + r) * D + (D / 8) * g + D / 16 + mt] = o2[mt % (MV == 3 ? MT : 1)][2 + e] * f;
          }
#endif
        }
      }
    }
  }
