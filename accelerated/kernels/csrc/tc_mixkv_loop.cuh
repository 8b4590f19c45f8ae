// Steps 3-4 of the partial kernel on tensor cores for KIVI keys beside per-token codebook values (turboquant, rabitq:
// the sibling of tc_mixed_loop.cuh, attention_tc.py): the keys' scores as tc_kivi_loop.cuh's (tc_kivi_scores.cuh), the
// values' m-tiles as tc_loop.cuh's (tc_loop_values.cuh: codes looked up in tabv, P' = p * norm * fv), a warp's chunks
// as KIVI's (KP consecutive ones in one key group).
#include "tc_mixed_scalar.h"
#include "tc_mixkv_setup.cuh"
  // one chunk's loads (tokens outside t0 .. t1 - 1 read token t0's rows, as tc_kivi_loop.cuh's): key words of tokens
  // tb + 8 nt + g; value words and norm VN of the tokens of slot x (rabitq, MV = 2: its factor (n s_d) / ip, 0 where
  // ip = 0, as tc_loop.cuh's)
#define TC_LOAD(J, KWD, VWD, VN) { \
    const int tb_ = ta + 16 * (J); \
    for (int nt = 0; nt < 2; ++nt) { \
      const int t_ = tb_ + 8 * nt + g; \
      VQ_TC_KWORDS(kbase + (int64_t)(t_ >= t0 && t_ < t1 ? t_ : t0) * kc1_strides[2], KWD[nt]); \
    } \
    for (int x = 0; x < 4; ++x) { \
      const int t_ = tb_ + 8 * (x >> 1) + 2 * tig + (x & 1); \
      const int64_t tt_ = (t_ >= t0 && t_ < t1) ? t_ : t0; \
      VQ_TC_VWORDS(vbase + tt_ * vc1_strides[2], VWD[x]); \
      VN[x] = vs0[vso + tt_ * vs0_strides[2]]; \
      if (MV == 2) { \
        const float ip_ = vs1[vso1 + tt_ * vs1_strides[2]]; \
        VN[x] = (ip_ > 0.0f) ? vq_fdiv(VN[x] * f_k[0], ip_) : 0.0f; \
      } \
    } }
  constexpr int PFD = (PF > 0) ? PF : 1;
  uint32_t kwc[2][KWL], vwc[4][VWL], kwp[PFD][2][KWL], vwp[PFD][4][VWL];
  float vnc[4], vnp[PFD][4];
  // a warp's chunks: KP consecutive ones, then KP * NW further on; KP divides PF (tc_kivi_loop.cuh)
  for (int q = 0; q < PF; ++q) {
    const int jq = (q / KP) * (KP * NW) + KP * warp + q % KP;
    if (jq < nch) {
      TC_LOAD(jq, kwp[q], vwp[q], vnp[q])
    }
  }
  // tc_loads.cuh's parameters: the side registers each key and value slot takes and shifts
#define TC_PF PF
#define TC_KSIDES(F, i)
#define TC_XSIDES(F, i) F(vn, i)
#define TC_LOAD_NEXT TC_LOAD(j + PF * NW, kwp[PFD - 1], vwp[PFD - 1], vnp[PFD - 1])
#define TC_LOAD_NOW TC_LOAD(j, kwc, vwc, vnc)
  for (int j = KP * warp; j < nch; j += (j % KP == KP - 1) ? KP * NW - KP + 1 : 1) {
#include "tc_loads.cuh"
#include "tc_kivi_scores.cuh"
#include "tc_loop_softmax.cuh"
#include "tc_loop_values.cuh"
  }
#undef TC_LOAD
#undef VQ_TC_KWORDS
#undef VQ_TC_VWORDS
#undef VQ_TC_ALIGN
#include "tc_mixed_merge.cuh"
