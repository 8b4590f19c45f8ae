// partial_loop_keys.h's keys not loaded ahead (KPRE false): decoded from their code rows, every method.
          const int ttk = VQ_KROW(tt);
          const DEVICE uint32_t* row1 = kc1 + (int64_t)b * kc1_strides[0] + (int64_t)h * kc1_strides[1]
                                        + (int64_t)ttk * kc1_strides[2];
          const DEVICE uint32_t* row2 = kc2 + (int64_t)b * kc2_strides[0] + (int64_t)h * kc2_strides[1]
                                        + (int64_t)ttk * kc2_strides[2];
          if (MK <= 3) {
            kfac[u] = ks0[(int64_t)b * ks0_strides[0] + (int64_t)h * ks0_strides[1] + (int64_t)ttk * ks0_strides[2]];
          }
          if (MK == 2 || MK == 3) {
            const float a1 = ks1[(int64_t)b * ks1_strides[0] + (int64_t)h * ks1_strides[1] + (int64_t)ttk * ks1_strides[2]];
            if (MK == 2) {
              kfac[u] = (a1 > 0.0f) ? (kfac[u] * f_k[0]) / a1 : 0.0f;   // g = (n s_d) / ip
            } else {
              kfac2[u] = a1 * f_k[1];                                  // gamma A_d
            }
          }
          for (int k = 0; k < NCH; ++k) {
            const int ch = lp + k * P;
            float v8[8];
            if (MK == 0 || MK == 3) {
              VQ_CHUNK(KB1, row1, ch, rk1, v8);
            }
            if (MK == 1) {
              float w8[8];
              VQ_CHUNK(KB1, row1, ch, rk1, v8);
              VQ_CHUNK(KB2, row2, ch, rk2, w8);
              for (int j = 0; j < 8; ++j) {
                v8[j] += w8[j];
              }
            }
            if (MK == 2) {
              VQ_CHUNK(1, row1, ch, rk1, v8);
            }
            if (MK == 3) {
              float w8[8];
              VQ_CHUNK(1, row2, ch, rk2, w8);
              for (int j = 0; j < 8; ++j) {
                kv2[(k * 8 + j) % (KPARTS == 2 ? NC : 1)] = w8[j];
              }
            }
            if (MK == 4 || MK == 5) {
              for (int j = 0; j < 8; ++j) {
                const int c = ch * 8 + j;
                const int64_t g = (int64_t)b * kgs_strides[0] + (int64_t)h * kgs_strides[1]
                                  + (int64_t)(MK == 4 ? VQ_KGROW(ttk) : ttk) * kgs_strides[2]
                                  + (int64_t)(MK == 4 ? c : c / KG) * kgs_strides[3];
                const float x = (float)vq_code<KB1>(row1, c) * static_cast<float>(kgs[g]);
                v8[j] = (MK == 4) ? x + static_cast<float>(kgz[g])
                                  : vq_round_to(kgs[0], vq_round_to(kgs[0], x) + static_cast<float>(kgz[g]));
              }
            }
            for (int j = 0; j < 8; ++j) {
              kv[k * 8 + j] = v8[j];
            }
          }
