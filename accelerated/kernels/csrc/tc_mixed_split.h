// The scalar splits of a MIXED partial (attention_source.MIXED_WINDOWS, HASWIN 2 / 3 / 4) on the tensor-core kernel of
// one role per token beside KIVI's other (tc_mixed_loop.cuh, tc_mixkv_loop.cuh): the window split (tokens 0 .. t1 - 1,
// each role's window from its own row tt + KWO / tt + VWO, at position WQ + tt) and splits VQ_MIX0 .. S - 1 (xt0 ..
// xt1 - 1: the rows this launch's append encodes, in S - 1, and one role's window beside the other's records). Few
// tokens, some exact, so scalar arithmetic as partial_loop.h attends them, laid out as tc_window.h's: warp w takes
// tokens w, w + NW, ..., lane l coordinates l + 32 j. Encoded keys dot sq (rotated in those splits for rotated keys);
// exact keys the scaled query as given, qx (a rotation keeps dot products: partial_loop.h rotates the key instead, its
// query registers being rotated). The pair's token macros (VQ_TC_MTOKEN: tc_mixed_token.h, tc_mixkv_token.h) read the
// records.
    constexpr int WJ = D / 32;
    float wm[QB];
    float wl[QB];
    float wo[QB][WJ];
    float qx[QB][WJ];
    for (int r = 0; r < QB; ++r) {
      wm[r] = NEG_INF;
      wl[r] = 0.0f;
      const int qr_ = qg * QB + r;
      const int64_t qo = (int64_t)b * q_strides[0] + (int64_t)(h * rep + qr_ / L) * q_strides[1]
                         + (int64_t)(qr_ % L) * q_strides[2];
      for (int j = 0; j < WJ; ++j) {
        wo[r][j] = 0.0f;
        qx[r][j] = qr_ < nq ? static_cast<float>(q[qo + (int64_t)(lane + 32 * j) * q_strides[3]]) * f_scale[0] : 0.0f;
      }
    }
    const int64_t vgb = (int64_t)b * vgs_strides[0] + (int64_t)h * vgs_strides[1];
    const int x0 = is_win ? t0 : xt0;
    const int x1 = is_win ? t1 : xt1;
#include VQ_TC_MTOKEN
    // (split S - 1's tokens: index i is token i, or i + VQ_XG from VQ_XA on: the other scalar splits' share skipped)
    const int vq_xa = (!is_win && s == S - 1) ? VQ_XA : x1;
    const int vq_xg = (!is_win && s == S - 1) ? VQ_XGOF(x1) : 0;
#define VQ_MT_AT(I) ((I) < vq_xa ? (I) : (I) + vq_xg)
#if VQ_WPF
    // (tuning's tc_window_prefetch: a warp's next token's rows loaded while this one is scored, as tc_window.h)
    VQ_MT_DECL(c)
    if (x0 + warp < x1) VQ_MT_LOAD(VQ_MT_AT(x0 + warp), c)
#endif
    for (int vq_i = x0 + warp; vq_i < x1; vq_i += NW) {
      const int tt = VQ_MT_AT(vq_i);
#if VQ_WPF
      VQ_MT_DECL(n)
      const bool vq_more = vq_i + NW < x1;
      if (vq_more) VQ_MT_LOAD(VQ_MT_AT(vq_i + NW), n)
#else
      VQ_MT_DECL(c)
      VQ_MT_LOAD(tt, c)
#endif
      VQ_MT_TOKEN(tt, c)
      for (int r = 0; r < QB; ++r) {
        float dot = 0.0f;
        for (int j = 0; j < WJ; ++j) {
          dot += (kex ? qx[r][j] : sq[r * D + lane + 32 * j]) * kv[j];
        }
        for (int o2 = 16; o2 > 0; o2 >>= 1) {
          dot += SHFL_XOR(dot, o2);
        }
        dot = kex ? dot : dot * kn;
        if (qg * QB + r < nq && (!CAUSAL || (is_win ? WQ + tt : tt) <= qpos[r])) {
#include "tc_window_step.h"
        }
      }
#if VQ_WPF
      if (vq_more) {
        VQ_MT_SHIFT
      }
#endif
    }
#undef VQ_MT_AT
#undef VQ_MT_VEX
#undef VQ_MT_DECL
#undef VQ_MT_LOAD
#undef VQ_MT_TOKEN
#undef VQ_MT_SHIFT
#undef VQ_MT_ROTATE
#undef VQ_MT_ROWS
#include "tc_window_end.h"
