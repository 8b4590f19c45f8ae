// A MIXED split token's rows, both token headers' (tc_mixed_token.h, tc_mixkv_token.h): whether each role is exact
// here (kex_, vex_), its window row (kwr, vwr; the chunk kx / vx for the rows this launch's append writes: kq_new,
// vq_new) at offsets ko, vo, and its record row (ktr, vtr: 0 where exact, so every lane reads a readable row) with
// its first code stream's row (krow, vrow).
#define VQ_MT_ROWS(TT) \
      const bool kex_ = is_win || (TT) >= QK; \
      const bool vex_ = VQ_MT_VEX(TT); \
      const int kwr = is_win ? (TT) + KWO : (TT) - QK; \
      const int vwr = is_win ? (TT) + VWO : (TT) - QV; \
      const int kq_nw = kwr - (RK - VQ_TNEW); \
      const int vq_nw = vwr - (RV - VQ_TNEW); \
      const bool kq_new = APPEND && kq_nw >= 0; \
      const bool vq_new = APPEND && vq_nw >= 0; \
      const int64_t ko = kq_new ? (int64_t)b * kx_strides[0] + (int64_t)h * kx_strides[1] + (int64_t)kq_nw * kx_strides[2] \
                                : (int64_t)b * kw_strides[0] + (int64_t)h * kw_strides[1] + (int64_t)kwr * kw_strides[2]; \
      const int64_t vo = vq_new ? (int64_t)b * vx_strides[0] + (int64_t)h * vx_strides[1] + (int64_t)vq_nw * vx_strides[2] \
                                : (int64_t)b * vw_strides[0] + (int64_t)h * vw_strides[1] + (int64_t)vwr * vw_strides[2]; \
      const int ktr = kex_ ? 0 : (TT); \
      const int vtr = vex_ ? 0 : (TT); \
      const DEVICE uint32_t* krow = kc1 + (int64_t)b * kc1_strides[0] + (int64_t)h * kc1_strides[1] \
                                    + (int64_t)ktr * kc1_strides[2]; \
      const DEVICE uint32_t* vrow = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1] \
                                    + (int64_t)vtr * vc1_strides[2];
