// partial_loop_values.h's values not loaded ahead (VPRE false): decoded from their code rows, every method.
          const int ttv = VQ_VROW(tt);
          const DEVICE uint32_t* row1 = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1]
                                        + (int64_t)ttv * vc1_strides[2];
          const DEVICE uint32_t* row2 = vc2 + (int64_t)b * vc2_strides[0] + (int64_t)h * vc2_strides[1]
                                        + (int64_t)ttv * vc2_strides[2];
          if (MV <= 3) {
            vfac = vs0[(int64_t)b * vs0_strides[0] + (int64_t)h * vs0_strides[1] + (int64_t)ttv * vs0_strides[2]];
          }
          if (MV == 2 || MV == 3) {
            const float a1 = vs1[(int64_t)b * vs1_strides[0] + (int64_t)h * vs1_strides[1] + (int64_t)ttv * vs1_strides[2]];
            if (MV == 2) {
              vfac = (a1 > 0.0f) ? (vfac * f_k[0]) / a1 : 0.0f;
            } else {
              vfac2 = vfac * (a1 * f_k[1]);
            }
          }
          for (int k = 0; k < NCH; ++k) {
            const int ch = lp + k * P;
            float v8[8];
            if (MV == 0 || MV == 3) {
              VQ_CHUNK(VB1, row1, ch, rv1, v8);
            }
            if (MV == 1) {
              float w8[8];
              VQ_CHUNK(VB1, row1, ch, rv1, v8);
              VQ_CHUNK(VB2, row2, ch, rv2, w8);
              for (int j = 0; j < 8; ++j) {
                v8[j] += w8[j];
              }
            }
            if (MV == 2) {
              VQ_CHUNK(1, row1, ch, rv1, v8);
            }
            if (MV == 3) {
              float w8[8];
              VQ_CHUNK(1, row2, ch, rv2, w8);
              for (int j = 0; j < 8; ++j) {
                vv2[(k * 8 + j) % VP2] = w8[j];
              }
            }
            if (MV == 4 || MV == 5) {
              for (int j = 0; j < 8; ++j) {
                const int c = ch * 8 + j;
                const int64_t g = (int64_t)b * vgs_strides[0] + (int64_t)h * vgs_strides[1]
                                  + (int64_t)ttv * vgs_strides[2] + (int64_t)(c / VG) * vgs_strides[3];
                const float x = (float)vq_code<VB1>(row1, c) * static_cast<float>(vgs[g]);
                v8[j] = (MV == 4) ? x + static_cast<float>(vgz[g])
                                  : vq_round_to(vgs[0], vq_round_to(vgs[0], x) + static_cast<float>(vgz[g]));
              }
            }
            for (int j = 0; j < 8; ++j) {
              vv[k * 8 + j] = v8[j];
            }
          }
