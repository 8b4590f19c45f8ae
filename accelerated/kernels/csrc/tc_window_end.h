// The end of a scalar split of the tensor-core partial (tc_window.h, tc_mixed_split.h): each warp's state wm / wl /
// wo in swm / swl / swo as the mma loop leaves its own (the value sums scaled to the maximum over the warps).
    if (lane == 0) {
      for (int r = 0; r < QB; ++r) {
        swm[warp * 4 + r] = wm[r];
        swl[warp * 4 + r] = wl[r];
      }
    }
    BARRIER();
    for (int r = 0; r < QB; ++r) {
      float mx = NEG_INF;
      for (int w = 0; w < NW; ++w) {
        mx = vq_max(mx, swm[w * 4 + r]);
      }
      const float f = (wm[r] == NEG_INF) ? 0.0f : vq_exp2(wm[r] - mx);
      for (int j = 0; j < WJ; ++j) {
        swo[(warp * QB + r) * D + lane + 32 * j] = wo[r][j] * f;
      }
    }
