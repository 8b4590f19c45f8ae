// Steps 3-4 of the partial kernel on tensor cores (CUDA sm_80+; accelerated/kernels/attention_tc.py says how).

#include "tc_loop_setup.cuh"
#include VQ_TC_STAGE2
  // one chunk's loads: key words of tokens tb + 8 nt + g; value words, key and value norms of the tokens of
  // slot x: tb + 8 (x / 2) + 2 tig + x % 2 (a score's C slot, a probability's B slot and a value's A slot)
#define TC_LOAD(J, KWD, VWD, KN, VN, KWD2, VWD2, KN2, VN2) { \
    const int tb_ = t0 + 16 * (J); \
    for (int nt = 0; nt < 2; ++nt) { \
      const int t_ = tb_ + 8 * nt + g; \
      VQ_TC_KWORDS(kbase + (int64_t)(t_ < t1 ? t_ : t0) * kc1_strides[2], KWD[nt]); \
      TC_KEYS2((int64_t)(t_ < t1 ? t_ : t0), KWD2[nt]) \
    } \
    for (int x = 0; x < 4; ++x) { \
      const int t_ = tb_ + 8 * (x >> 1) + 2 * tig + (x & 1); \
      const int64_t tt_ = (t_ < t1) ? t_ : t0; \
      VQ_TC_VWORDS(vbase + tt_ * vc1_strides[2], VWD[x]); \
      TC_VALUES2(tt_, VWD2[x]) \
      TC_KNORM2(tt_, KN2[x]) \
      TC_VNORM2(tt_, VN2[x]) \
      KN[x] = ks0[kso + tt_ * ks0_strides[2]]; \
      VN[x] = vs0[vso + tt_ * vs0_strides[2]]; \
      if (MK == 2) { \
        const float ip_ = ks1[kso1 + tt_ * ks1_strides[2]]; \
        KN[x] = (ip_ > 0.0f) ? vq_fdiv(KN[x] * f_k[0], ip_) : 0.0f; \
      } \
      if (MV == 2) { \
        const float ip_ = vs1[vso1 + tt_ * vs1_strides[2]]; \
        VN[x] = (ip_ > 0.0f) ? vq_fdiv(VN[x] * f_k[0], ip_) : 0.0f; \
      } \
    } }
  // PF > 0: the loads of the next PF chunks in flight (register sets, shifted down once per chunk); PF = 0:
  // a chunk's loads at its start
  constexpr int PFD = (PF > 0) ? PF : 1;
  uint32_t kwc[2][KWL], vwc[4][VWL], kwp[PFD][2][KWL], vwp[PFD][4][VWL];
  float knc[4], vnc[4], knp[PFD][4], vnp[PFD][4];
  for (int q = 0; q < PF; ++q) {
    if (warp + q * NW < nch) {
      TC_LOAD(warp + q * NW, kwp[q], vwp[q], knp[q], vnp[q], kwp2[q], vwp2[q], knp2[q], vnp2[q])
    }
  }
  // tc_loads.cuh's parameters: the side registers each key and value slot takes and shifts
#define TC_PF PF
#define TC_KSIDES(F, i)
#define TC_XSIDES(F, i) F(kn, i) F(vn, i)
#define TC_LOAD_NEXT TC_LOAD(j + PF * NW, kwp[PFD - 1], vwp[PFD - 1], knp[PFD - 1], vnp[PFD - 1], kwp2[PFD - 1], \
                             vwp2[PFD - 1], knp2[PFD - 1], vnp2[PFD - 1])
#define TC_LOAD_NOW TC_LOAD(j, kwc, vwc, knc, vnc, kwc2, vwc2, knc2, vnc2)
  for (int j = warp; j < nch; j += NW) {
#include "tc_loads.cuh"
#include "tc_loop_scores.cuh"
#include "tc_loop_softmax.cuh"
#include "tc_loop_values.cuh"
  }
#undef TC_LOAD
#undef VQ_TC_KWORDS
#undef VQ_TC_VWORDS
#undef VQ_TC_ALIGN
#undef TC_KEYS2
#undef TC_VALUES2
#undef TC_KNORM2
#undef TC_VNORM2
#include VQ_TC_MERGE
