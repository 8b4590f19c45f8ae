// Steps 3-4 of the partial kernel on tensor cores for turboquant keys beside KIVI values (attention_tc.py): the keys'
// score pass as tc_loop.cuh's (csrc/tc_tens_*.cuh: 3-bit codes or whole words), the values' m-tiles as
// tc_kivi_loop.cuh's (s code + z dequantized into A). KIVI values hold no group of tokens, so chunks start at t0.
#include "tc_mixed_scalar.h"
#include "tc_loop_setup.cuh"
  constexpr uint32_t VMASK = (1u << VB1) - 1u;
  // a lane group's D / 8 value coordinates lie in one coordinate group (D / 8 <= 16 <= VG): one (s, z) per token
  const int64_t vgo = (int64_t)b * vgs_strides[0] + (int64_t)h * vgs_strides[1]
                      + (int64_t)((g * (D / 8)) / VG) * vgs_strides[3];
#include "tc_vgroup.cuh"
  // one chunk's loads (tokens past t1 read token t0's rows): key words and norms KN as tc_loop.cuh's; per value
  // slot x the token's words, scale VS, zero VZ and VN, the chunk's largest (2^VB1 - 1) |s| + |z| over the warp
#define TC_LOAD(J, KWD, KN, VWD, VS, VZ, VN) { \
    const int tb_ = t0 + 16 * (J); \
    for (int nt = 0; nt < 2; ++nt) { \
      const int t_ = tb_ + 8 * nt + g; \
      VQ_TC_KWORDS(kbase + (int64_t)(t_ < t1 ? t_ : t0) * kc1_strides[2], KWD[nt]); \
    } \
    float bd_ = 0.0f; \
    for (int x = 0; x < 4; ++x) { \
      const int t_ = tb_ + 8 * (x >> 1) + 2 * tig + (x & 1); \
      const int64_t tt_ = (t_ < t1) ? t_ : t0; \
      KN[x] = ks0[kso + tt_ * ks0_strides[2]]; \
      VQ_TC_VWORDS(vbase + tt_ * vc1_strides[2], VWD[x]); \
      TC_VGROUP(VS, VZ) \
    } \
    TC_VNORM(VN) }
  constexpr int PFD = (PF > 0) ? PF : 1;
  uint32_t kwc[2][KWL], vwc[4][VWL], kwp[PFD][2][KWL], vwp[PFD][4][VWL];
  float knc[4], vsc[4], vzc[4], vnc[4], knp[PFD][4], vsp[PFD][4], vzp[PFD][4], vnp[PFD][4];
  for (int q = 0; q < PF; ++q) {
    if (warp + q * NW < nch) {
      TC_LOAD(warp + q * NW, kwp[q], knp[q], vwp[q], vsp[q], vzp[q], vnp[q])
    }
  }
  // tc_loads.cuh's parameters: the side registers each key and value slot takes and shifts
#define TC_PF PF
#define TC_KSIDES(F, i)
#define TC_XSIDES(F, i) F(kn, i) F(vs, i) F(vz, i) F(vn, i)
#define TC_LOAD_NEXT TC_LOAD(j + PF * NW, kwp[PFD - 1], knp[PFD - 1], vwp[PFD - 1], vsp[PFD - 1], vzp[PFD - 1], \
                             vnp[PFD - 1])
#define TC_LOAD_NOW TC_LOAD(j, kwc, knc, vwc, vsc, vzc, vnc)
  for (int j = warp; j < nch; j += NW) {
#include "tc_loads.cuh"
#include "tc_loop_scores.cuh"
#include "tc_loop_softmax.cuh"
#include "tc_kivi_values.cuh"
  }
#undef TC_LOAD
#undef TC_VGROUP
#undef TC_VNORM
#undef VQ_TC_KWORDS
#undef VQ_TC_VWORDS
#undef VQ_TC_ALIGN
#include "tc_mixed_merge.cuh"
