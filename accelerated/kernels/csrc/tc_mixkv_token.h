// tc_mixed_split.h's token for KIVI keys beside codebook values (tc_mixkv_loop.cuh; tc_mixed_token.h's macros for
// this pair): an encoded key is code * s + z of its group VQ_KGROW(TT) (kn = 1: KIVI keys are not rotated, so sq is
// the query as given), an encoded value its code's table entry times the token's norm (rabitq: its factor; the
// lookups shuffle, so every lane takes them: rows clamped to readable ones where exact); an exact role reads its
// window row, or the chunk kx / vx for the rows this launch's append writes into the window. In split S - 1 an exact
// value (past QV) is rotated into the values' domain as the encoded ones are (tc_mixkv_rotate.h).
#include "tc_mixed_rows.h"
#define VQ_MT_VEX(TT) (is_win || (TT) >= QV)
#define VQ_MT_DECL(S) uint32_t kwd##S[WJ]; float kxe##S[WJ]; float ksc##S[WJ]; float kzc##S[WJ]; \
    uint32_t vwd##S[WJ]; float vxe##S[WJ]; float vn##S;
#define VQ_MT_LOAD(TT, S) { \
      VQ_MT_ROWS(TT) \
      const int64_t go = kgo + (int64_t)VQ_KGROW(ktr) * kgs_strides[2]; \
      vn##S = vs0[vso + (int64_t)vtr * vs0_strides[2]]; \
      const float ip_ = (MV == 2) ? vs1[vso1 + (int64_t)vtr * vs1_strides[2]] : 1.0f; \
      vn##S = (MV != 2) ? vn##S : (ip_ > 0.0f) ? vq_fdiv(vn##S * f_k[0], ip_) : 0.0f; \
      for (int j = 0; j < WJ; ++j) { \
        const int c = lane + 32 * j; \
        vwd##S[j] = vq_code_word<VB1>(vrow, c); \
        vxe##S[j] = !vex_ ? 0.0f : vq_new ? static_cast<float>(vx[vo + (int64_t)c * vx_strides[3]]) \
                                          : static_cast<float>(vw[vo + (int64_t)c * vw_strides[3]]); \
        if (kex_) { \
          kxe##S[j] = kq_new ? static_cast<float>(kx[ko + (int64_t)c * kx_strides[3]]) \
                             : static_cast<float>(kw[ko + (int64_t)c * kw_strides[3]]); \
          kwd##S[j] = 0u; \
          ksc##S[j] = 0.0f; \
          kzc##S[j] = 0.0f; \
        } else { \
          kxe##S[j] = 0.0f; \
          kwd##S[j] = vq_code_word<KB1>(krow, c); \
          ksc##S[j] = static_cast<float>(kgs[go + (int64_t)c * kgs_strides[3]]); \
          kzc##S[j] = static_cast<float>(kgz[go + (int64_t)c * kgs_strides[3]]); \
        } \
      } }
// (loop scope: kex, kn, kv, vv are the token's)
#define VQ_MT_TOKEN(TT, S) \
      const bool kex = is_win || (TT) >= QK; \
      const bool vex = VQ_MT_VEX(TT); \
      const float kn = 1.0f; \
      float kv[WJ]; \
      float vv[WJ]; \
      for (int j = 0; j < WJ; ++j) { \
        const int c = lane + 32 * j; \
        const float vc = VQ_LOOKUP(rv1, vq_code_w<VB1>(vwd##S[j], c)) * vn##S; \
        vv[j] = vex ? vxe##S[j] : vc; \
        const float x = (float)vq_code_w<KB1>(kwd##S[j], c) * ksc##S[j]; \
        kv[j] = kex ? kxe##S[j] : x + kzc##S[j]; \
      } \
      if (is_mix && vex) { \
        VQ_MT_ROTATE(vv) \
      }
// (tuning's tc_window_prefetch: the next token's set n becomes the current one, c)
#define VQ_MT_SHIFT \
        vnc = vnn; \
        for (int j = 0; j < WJ; ++j) { \
          kwdc[j] = kwdn[j]; \
          kxec[j] = kxen[j]; \
          kscc[j] = kscn[j]; \
          kzcc[j] = kzcn[j]; \
          vwdc[j] = vwdn[j]; \
          vxec[j] = vxen[j]; \
        }
#include "tc_mixkv_rotate.h"
