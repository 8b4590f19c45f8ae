// f_x[e] = exact upcast of x[b, h, VQ_X_TOKEN, lane + LW*e] (read through x's strides); NaN/Inf noted.

    float f_x[E];
    for (int e = 0; e < E; ++e) {
      f_x[e] = 0.0f;
      if (act) {
        f_x[e] = TO_F32(x[xrow + (int64_t)(VQ_X_TOKEN) * xs2 + (int64_t)(lane + LW * e) * xs3]);
      }
      bad_x = bad_x || !(ABS(f_x[e]) <= f_fmax);
    }
#undef VQ_X_TOKEN
