// partial_loop_keys.h's exact keys (window split; MIXED: split S - 1 past the keys' records), rotated in MIXED.
      if (kex) {
#if VQ_MIXED
        kfac[u] = 1.0f;
        kfac2[u] = 0.0f;
#endif
        // APPEND with a window: this launch's append writes the window's last VQ_TNEW rows (split S - 1, as
        // attention_append.h runs it), so this split reads those tokens from the chunk kx itself
        const int vq_nw = kwr - (RK - VQ_TNEW);
#if VQ_MIXED
        for (int c = 0; c < NC; ++c) {
          kv2[c % (KPARTS == 2 ? NC : 1)] = 0.0f;
        }
#endif
        if (APPEND && HASWIN && vq_nw >= 0) {
          const int64_t nbase = (int64_t)b * kx_strides[0] + (int64_t)h * kx_strides[1] + (int64_t)vq_nw * kx_strides[2];
          for (int k = 0; k < NCH; ++k) {
            for (int j = 0; j < 8; ++j) {
              kv[k * 8 + j] = static_cast<float>(kx[nbase + (int64_t)((lp + k * P) * 8 + j) * kx_strides[3]]);
            }
          }
        } else {
          const int64_t base = (int64_t)b * kw_strides[0] + (int64_t)h * kw_strides[1] + (int64_t)kwr * kw_strides[2];
          for (int k = 0; k < NCH; ++k) {
            for (int j = 0; j < 8; ++j) {
              kv[k * 8 + j] = static_cast<float>(kw[base + (int64_t)((lp + k * P) * 8 + j) * kw_strides[3]]);
            }
          }
        }
      }
#if VQ_MIXED
      if (KROT && s == S - 1) {     // (every lane of the block: the butterflies shuffle)
        float kr_[NC];
        for (int c = 0; c < NC; ++c) {
          kr_[c] = kv[c];
        }
        VQ_ROTATE(kr_, f_ksig)
        for (int c = 0; c < NC; ++c) {
          kv[c] = kex ? kr_[c] : kv[c];
        }
      }
#endif
