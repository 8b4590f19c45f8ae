// The combine launch's (c): the splits' value rows weighted by cw, summed per coordinate into cy (and cy2).
  // (c) the weighted value sums: coordinate CT % D over splits CT / D, + CG, ..., then the CG groups added
  {
    const int c = CT % D;
    float y = 0.0f;
    float y2 = 0.0f;
    for (int s2 = CT / D; s2 < S; s2 += CG) {
      const float w = cw[s2];
      y += o_acc[(row0 + s2) * VPARTS * D + c] * w;
      if (VPARTS == 2) {
        y2 += o_acc[(row0 + s2) * VPARTS * D + D + c] * w;
      }
    }
    cpart[CT] = y;
    if (VPARTS == 2) {
      cpart[CNT + CT] = y2;
    }
  }
  BARRIER();
  for (int c = CT; c < D; c += CNT) {
    float y = 0.0f;
    float y2 = 0.0f;
    for (int g = 0; g < CG; ++g) {
      y += cpart[g * D + c];
      if (VPARTS == 2) {
        y2 += cpart[CNT + g * D + c];
      }
    }
    cy[c] = y;
    if (VPARTS == 2) {
      cy2[c] = y2;
    }
  }
  BARRIER();
