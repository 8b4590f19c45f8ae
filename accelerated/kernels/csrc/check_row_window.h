// encode.h's check-only row i >= ne in a scope with an exact window (check_count_window.h): chunk token i - ne,
// checked for NaN/Inf as load_x.h checks x and stored unchanged into its row vq_wrow + (i - ne) of the window.
    {
      const int64_t vq_src = (int64_t)b * wx_strides[0] + (int64_t)h * wx_strides[1] + (int64_t)(i - ne) * wx_strides[2];
      const int64_t vq_dst = (int64_t)b * w_strides[0] + (int64_t)h * w_strides[1]
                             + (int64_t)(vq_wrow + i - ne) * w_strides[2];
      for (int e = 0; e < E; ++e) {
        if (act) {
          const auto vq_v = wx[vq_src + (int64_t)(lane + LW * e) * wx_strides[3]];
          wdst[vq_dst + (int64_t)(lane + LW * e) * w_strides[3]] = vq_v;
          bad_x = bad_x || !(ABS(TO_F32(vq_v)) <= f_fmax);
        }
      }
    }
