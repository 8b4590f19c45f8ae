// tc_mixed_split.h's token tt: this lane's key and value coordinates kv, vv (c = lane + 32 j) and the key's norm kn.
// A role exact here (the window split; split S - 1 past its records) reads its window row, or the chunk kx / vx for
// the rows this launch's append writes into the window (partial_loop.h does the same); else its records (rows
// clamped to readable ones where exact: the lookups shuffle, so every lane takes them).
      const bool kex = is_win || tt >= QK;
#if VQ_RAGGED
      const bool vex = is_win || tt >= QVR;     // (ragged: past the row's own records; window rows from QV on)
#else
      const bool vex = is_win || tt >= QV;
#endif
      const int kwr = is_win ? tt + KWO : tt - QK;
      const int vwr = is_win ? tt + VWO : tt - QV;
      const int kq_nw = kwr - (RK - VQ_TNEW);
      const int vq_nw = vwr - (RV - VQ_TNEW);
      const bool kq_new = APPEND && kq_nw >= 0;
      const bool vq_new = APPEND && vq_nw >= 0;
      const int64_t ko = kq_new ? (int64_t)b * kx_strides[0] + (int64_t)h * kx_strides[1] + (int64_t)kq_nw * kx_strides[2]
                                : (int64_t)b * kw_strides[0] + (int64_t)h * kw_strides[1] + (int64_t)kwr * kw_strides[2];
      const int64_t vo = vq_new ? (int64_t)b * vx_strides[0] + (int64_t)h * vx_strides[1] + (int64_t)vq_nw * vx_strides[2]
                                : (int64_t)b * vw_strides[0] + (int64_t)h * vw_strides[1] + (int64_t)vwr * vw_strides[2];
      const int ktr = kex ? 0 : tt;
      const int vtr = vex ? 0 : tt;
      const DEVICE uint32_t* krow = kc1 + (int64_t)b * kc1_strides[0] + (int64_t)h * kc1_strides[1]
                                    + (int64_t)ktr * kc1_strides[2];
      const DEVICE uint32_t* vrow = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1]
                                    + (int64_t)vtr * vc1_strides[2];
      const float kn = ks0[kso + (int64_t)ktr * ks0_strides[2]];
      float kv[WJ];
      float vv[WJ];
      for (int j = 0; j < WJ; ++j) {
        const int c = lane + 32 * j;
        const float kc = VQ_LOOKUP(rk1, vq_code<KB1>(krow, c));
        if (kex) {
          kv[j] = kq_new ? static_cast<float>(kx[ko + (int64_t)c * kx_strides[3]])
                         : static_cast<float>(kw[ko + (int64_t)c * kw_strides[3]]);
        } else {
          kv[j] = kc;
        }
        if (vex) {
          vv[j] = vq_new ? static_cast<float>(vx[vo + (int64_t)c * vx_strides[3]])
                         : static_cast<float>(vw[vo + (int64_t)c * vw_strides[3]]);
        } else {
          const int64_t gi = vgb + (int64_t)vtr * vgs_strides[2] + (int64_t)(c / VG) * vgs_strides[3];
          const float x = (float)vq_code<VB1>(vrow, c) * static_cast<float>(vgs[gi]);
          vv[j] = x + static_cast<float>(vgz[gi]);
        }
      }
