// partial_loop_values.h's exact values (window split; MIXED: split S - 1 past the values' records), rotated in MIXED.
      if (vex) {
#if VQ_MIXED
        vfac = 1.0f;
        vfac2 = 0.0f;
#endif
        // APPEND with a window: this launch's append writes the window's last VQ_TNEW rows (split S - 1, as
        // attention_append.h runs it), so this split reads those tokens from the chunk vx itself
        const int vq_nw = vwr - (RV - VQ_TNEW);
#if VQ_MIXED
        for (int c = 0; c < VP2; ++c) {
          vv2[c] = 0.0f;
        }
#endif
        if (APPEND && HASWIN && vq_nw >= 0) {
          const int64_t nbase = (int64_t)b * vx_strides[0] + (int64_t)h * vx_strides[1] + (int64_t)vq_nw * vx_strides[2];
          for (int k = 0; k < NCH; ++k) {
            for (int j = 0; j < 8; ++j) {
              vv[k * 8 + j] = static_cast<float>(vx[nbase + (int64_t)((lp + k * P) * 8 + j) * vx_strides[3]]);
            }
          }
        } else {
          const int64_t base = (int64_t)b * vw_strides[0] + (int64_t)h * vw_strides[1] + (int64_t)vwr * vw_strides[2];
          for (int k = 0; k < NCH; ++k) {
            for (int j = 0; j < 8; ++j) {
              vv[k * 8 + j] = static_cast<float>(vw[base + (int64_t)((lp + k * P) * 8 + j) * vw_strides[3]]);
            }
          }
        }
      }
#if VQ_MIXED
      if (VROT && s == S - 1) {     // (every lane of the block: the butterflies shuffle)
        float vr_[NC];
        for (int c = 0; c < NC; ++c) {
          vr_[c] = vv[c];
        }
        VQ_ROTATE(vr_, f_vsig)
        for (int c = 0; c < NC; ++c) {
          vv[c] = vex ? vr_[c] : vv[c];
        }
      }
#endif
