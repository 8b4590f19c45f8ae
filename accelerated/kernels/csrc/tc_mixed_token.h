// tc_mixed_split.h's token: this lane's key and value coordinates kv, vv (c = lane + 32 j) and the key's norm kn, in
// two steps so that a token's loads can be issued a token ahead (VQ_WPF): VQ_MT_LOAD(TT, S) reads its raw rows into
// register set S (code words, exact rows, the values' scale and zero), VQ_MT_TOKEN(TT, S) makes kex, kn, kv and vv
// of them. A role exact here (the window split; split S - 1 past its records) reads its window row, or the chunk kx /
// vx for the rows this launch's append writes into the window (partial_loop.h does the same); else its records (rows
// clamped to readable ones where exact: the lookups shuffle, so every lane takes them).
#include "tc_mixed_rows.h"
#if VQ_RAGGED
#define VQ_MT_VEX(TT) (is_win || (TT) >= QVR)     // (ragged: past the row's own records; window rows from QV on)
#else
#define VQ_MT_VEX(TT) (is_win || (TT) >= QV)
#endif
#define VQ_MT_DECL(S) uint32_t kwd##S[WJ]; float kxe##S[WJ]; uint32_t vwd##S[WJ]; float vxe##S[WJ]; \
    float vsc##S[WJ]; float vzc##S[WJ]; float kn##S;
#define VQ_MT_LOAD(TT, S) { \
      VQ_MT_ROWS(TT) \
      kn##S = ks0[kso + (int64_t)ktr * ks0_strides[2]]; \
      for (int j = 0; j < WJ; ++j) { \
        const int c = lane + 32 * j; \
        kwd##S[j] = vq_code_word<KB1>(krow, c); \
        kxe##S[j] = !kex_ ? 0.0f : kq_new ? static_cast<float>(kx[ko + (int64_t)c * kx_strides[3]]) \
                                          : static_cast<float>(kw[ko + (int64_t)c * kw_strides[3]]); \
        if (vex_) { \
          vxe##S[j] = vq_new ? static_cast<float>(vx[vo + (int64_t)c * vx_strides[3]]) \
                             : static_cast<float>(vw[vo + (int64_t)c * vw_strides[3]]); \
        } else { \
          const int64_t gi = vgb + (int64_t)vtr * vgs_strides[2] + (int64_t)(c / VG) * vgs_strides[3]; \
          vwd##S[j] = vq_code_word<VB1>(vrow, c); \
          vsc##S[j] = static_cast<float>(vgs[gi]); \
          vzc##S[j] = static_cast<float>(vgz[gi]); \
        } \
      } }
// (tuning's tc_window_prefetch: the next token's set n becomes the current one, c)
#define VQ_MT_SHIFT \
        knc = knn; \
        for (int j = 0; j < WJ; ++j) { \
          kwdc[j] = kwdn[j]; \
          kxec[j] = kxen[j]; \
          vwdc[j] = vwdn[j]; \
          vxec[j] = vxen[j]; \
          vscc[j] = vscn[j]; \
          vzcc[j] = vzcn[j]; \
        }
// (loop scope: kex, kn, kv, vv are the token's)
#define VQ_MT_TOKEN(TT, S) \
      const bool kex = is_win || (TT) >= QK; \
      const bool vex = VQ_MT_VEX(TT); \
      const float kn = kn##S; \
      float kv[WJ]; \
      float vv[WJ]; \
      for (int j = 0; j < WJ; ++j) { \
        const int c = lane + 32 * j; \
        const float kc = VQ_LOOKUP(rk1, vq_code_w<KB1>(kwd##S[j], c)); \
        kv[j] = kex ? kxe##S[j] : kc; \
        if (vex) { \
          vv[j] = vxe##S[j]; \
        } else { \
          const float x = (float)vq_code_w<VB1>(vwd##S[j], c) * vsc##S[j]; \
          vv[j] = x + vzc##S[j]; \
        } \
      }
