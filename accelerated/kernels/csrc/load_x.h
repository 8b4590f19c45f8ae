// f_x[e] = exact upcast of x[b, h, VQ_X_TOKEN, lane + LW*e] (read through x's strides); NaN/Inf noted.

    float f_x[E];
    for (int e = 0; e < E; ++e) {
      f_x[e] = 0.0f;
      if (act) {
#ifdef VQ_X_OWN
        // (a windowed scope: its encoded tokens nq - vq_own .. nq - 1 are the chunk's own, read from it: check_count_window.h)
        const int vq_xt = (int)(VQ_X_TOKEN) - (nq - vq_own);   // >= 0: the chunk's token vq_xt
        const int64_t vq_xo = (int64_t)b * wx_strides[0] + (int64_t)h * wx_strides[1] + (int64_t)vq_xt * wx_strides[2]
                              + (int64_t)(lane + LW * e) * wx_strides[3];
        if (vq_xt >= 0) {
          f_x[e] = TO_F32(wx[vq_xo]);
        } else {
          f_x[e] = TO_F32(x[xrow + (int64_t)(VQ_X_TOKEN) * xs2 + (int64_t)(lane + LW * e) * xs3]);
        }
#else
        f_x[e] = TO_F32(x[xrow + (int64_t)(VQ_X_TOKEN) * xs2 + (int64_t)(lane + LW * e) * xs3]);
#endif
      }
      bad_x = bad_x || !(ABS(f_x[e]) <= f_fmax);
    }
#undef VQ_X_TOKEN
