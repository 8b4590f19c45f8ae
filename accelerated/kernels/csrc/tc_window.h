// The window split (is_win) of the tensor-core partial kernel (tc_loop.cuh), whose mma loop takes codes only: the R
// exact tokens in scalar arithmetic, as partial_loop.h attends them. Warp w takes tokens w, w + NW, ...; lane l
// coordinates l + 32 j; per query row an online softmax over the warp's tokens (log2 domain: sq holds the scaled
// queries, not rotated for the window), then this warp's state in swm / swl / swo as the mma loop leaves its own:
// row maxima and sums, the value sums scaled to the maximum over the warps. With APPEND the window's last VQ_TNEW rows
// are the chunk this launch's append writes into it: they are read from kx / vx (partial_loop.h does the same).
    constexpr int WJ = D / 32;
    float wm[QB];
    float wl[QB];
    float wo[QB][WJ];
    for (int r = 0; r < QB; ++r) {
      wm[r] = NEG_INF;
      wl[r] = 0.0f;
      for (int j = 0; j < WJ; ++j) {
        wo[r][j] = 0.0f;
      }
    }
    // token TT's key and value coordinates of this lane (the chunk's own rows from kx / vx)
#define VQ_WLOAD(TT, KV, VV) { \
      const int vq_nw = (TT) - (R - VQ_TNEW); \
      const bool vq_new = APPEND && HASWIN && vq_nw >= 0; \
      const int64_t ko = vq_new ? (int64_t)b * kx_strides[0] + (int64_t)h * kx_strides[1] + (int64_t)vq_nw * kx_strides[2] \
                                : (int64_t)b * kw_strides[0] + (int64_t)h * kw_strides[1] + (int64_t)(TT) * kw_strides[2]; \
      const int64_t vo = vq_new ? (int64_t)b * vx_strides[0] + (int64_t)h * vx_strides[1] + (int64_t)vq_nw * vx_strides[2] \
                                : (int64_t)b * vw_strides[0] + (int64_t)h * vw_strides[1] + (int64_t)(TT) * vw_strides[2]; \
      for (int j = 0; j < WJ; ++j) { \
        const int64_t c = lane + 32 * j; \
        KV[j] = vq_new ? static_cast<float>(kx[ko + c * kx_strides[3]]) : static_cast<float>(kw[ko + c * kw_strides[3]]); \
        VV[j] = vq_new ? static_cast<float>(vx[vo + c * vx_strides[3]]) : static_cast<float>(vw[vo + c * vw_strides[3]]); \
      } }
    float kv[WJ];
    float vv[WJ];
#if VQ_WPF
    // (tuning's tc_window_prefetch: a warp's next token loaded while this one is scored, the same arithmetic in the
    // same order; its tokens are otherwise one global-memory latency each, and KIVI's window is R + up to G - 1)
    if (t0 + warp < t1) VQ_WLOAD(t0 + warp, kv, vv)
#endif
    for (int tt = t0 + warp; tt < t1; tt += NW) {
#if VQ_WPF
      float kn[WJ];
      float vn[WJ];
      const bool vq_more = tt + NW < t1;
      if (vq_more) VQ_WLOAD(tt + NW, kn, vn)
#else
      VQ_WLOAD(tt, kv, vv)
#endif
      for (int r = 0; r < QB; ++r) {
        float dot = 0.0f;
        for (int j = 0; j < WJ; ++j) {
          dot += sq[r * D + lane + 32 * j] * kv[j];
        }
        for (int o2 = 16; o2 > 0; o2 >>= 1) {
          dot += SHFL_XOR(dot, o2);
        }
        if (qg * QB + r < nq && (!CAUSAL || Q + tt <= qpos[r])) {
#include "tc_window_step.h"
        }
      }
#if VQ_WPF
      if (vq_more) {
        for (int j = 0; j < WJ; ++j) {
          kv[j] = kn[j];
          vv[j] = vn[j];
        }
      }
#endif
    }
#undef VQ_WLOAD
#include "tc_window_end.h"
