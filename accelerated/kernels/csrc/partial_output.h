// Step 5 of the partial kernel, shared by both loops: the split's partial from sacc / sml.
  // 5. this split's partial: o_acc (B, Hkv, NQ, S + 1, VPARTS, D), o_ml (B, Hkv, NQ, S + 1, 2)
  VQ_COLD
  for (int i = tid; i < QB * VPARTS * D; i += NT) {
    const int r = qg * QB + i / (VPARTS * D);
    if (r < nq) {
      const int64_t row = (((int64_t)b * hkv + h) * nq + r) * (S + 1) + s;
      o_acc[row * VPARTS * D + i % (VPARTS * D)] = sacc[i];
    }
  }
  VQ_COLD
  for (int i = tid; i < QB * 2; i += NT) {
    const int r = qg * QB + i / 2;
    if (r < nq) {
      const int64_t row = (((int64_t)b * hkv + h) * nq + r) * (S + 1) + s;
      o_ml[row * 2 + i % 2] = sml[i];
    }
  }
