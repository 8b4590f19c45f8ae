// tc_loop_merge.cuh's end: the warps' states in swo / swm / swl summed into sacc, sml (tc_mixed_merge.cuh shares it).
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
