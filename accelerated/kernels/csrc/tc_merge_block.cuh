// tc_loop_merge.cuh's end: the warps' states in swo / swm / swl summed into sacc, sml (tc_mixed_merge.cuh and
// tc_two_merge.cuh share it). VQ_TC_O2 (undefined: 0): sacc holds VPARTS parts a row, swo's part p at p * SWP.
  BARRIER();
  VQ_COLD
#if VQ_TC_O2
  for (int i = tid; i < QB * VPARTS * D; i += NT) {
    const int at = ((i / D) % VPARTS) * SWP + (i / (VPARTS * D)) * D + i % D;      // (part, row, coordinate)
#define VQ_TC_AT(w) at + w * QB * D
#else
  for (int i = tid; i < QB * D; i += NT) {
#define VQ_TC_AT(w) w * QB * D + i
#endif
    float y = 0.0f;
    for (int w = 0; w < NW; ++w) {
      y += swo[VQ_TC_AT(w)];
    }
    sacc[i] = y;
  }
#undef VQ_TC_AT
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
