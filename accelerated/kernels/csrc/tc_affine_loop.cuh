// Steps 3-4 of the partial kernel on tensor cores for mlx_affine records (attention_tc.py; tc_loop.cuh's structure).

#include "tc_affine_setup.cuh"
#include "tc_vgroup.cuh"
  // one chunk's loads (tokens past t1 read token t0's rows): per key slot nt the token's words, its scale KSC and
  // bias KZC (this lane quarter's coordinate group); per value slot x the token's words, scale VS and bias VZ (this
  // lane group's coordinate group) and VN, the largest |v| any lane's group can take in this chunk's tokens,
  // (2^VB1 - 1) |s| + |z| over the warp (the softmax fragment's value norm: fv puts it below 2^11)
#define TC_LOAD(J, KWD, KSC, KZC, VWD, VS, VZ, VN) { \
    const int tb_ = t0 + 16 * (J); \
    for (int nt = 0; nt < 2; ++nt) { \
      const int t_ = tb_ + 8 * nt + g; \
      const int64_t tt_ = t_ < t1 ? t_ : t0; \
      vq_words<KWL>(kbase + tt_ * kc1_strides[2], KWD[nt]); \
      KSC[nt] = static_cast<float>(kgs[kgo + tt_ * kgs_strides[2]]); \
      KZC[nt] = static_cast<float>(kgz[kgo + tt_ * kgs_strides[2]]); \
    } \
    float bd_ = 0.0f; \
    for (int x = 0; x < 4; ++x) { \
      const int t_ = tb_ + 8 * (x >> 1) + 2 * tig + (x & 1); \
      const int64_t tt_ = t_ < t1 ? t_ : t0; \
      vq_words<VWL>(vbase + tt_ * vc1_strides[2], VWD[x]); \
      TC_VGROUP(VS, VZ) \
    } \
    TC_VNORM(VN) }
  // 8-bit codes: one chunk ahead at most (their words, 16 per key and value slot set, would spill at tc_prefetch 2)
  constexpr int PFA = (KB1 == 8 || VB1 == 8) && PF > 1 ? 1 : PF;
  constexpr int PFD = (PFA > 0) ? PFA : 1;
  uint32_t kwc[2][KWL], vwc[4][VWL], kwp[PFD][2][KWL], vwp[PFD][4][VWL];
  float ksc[2], kzc[2], ksp[PFD][2], kzp[PFD][2];
  float vsc[4], vzc[4], vnc[4], vsp[PFD][4], vzp[PFD][4], vnp[PFD][4];
  for (int q = 0; q < PFA; ++q) {
    if (warp + q * NW < nch) {
      TC_LOAD(warp + q * NW, kwp[q], ksp[q], kzp[q], vwp[q], vsp[q], vzp[q], vnp[q])
    }
  }
  // tc_loads.cuh's parameters: the side registers each key and value slot takes and shifts
#define TC_PF PFA
#define TC_KSIDES(F, i) F(ks, i) F(kz, i)
#define TC_XSIDES(F, i) F(vs, i) F(vz, i) F(vn, i)
#define TC_LOAD_NEXT TC_LOAD(j + PFA * NW, kwp[PFD - 1], ksp[PFD - 1], kzp[PFD - 1], vwp[PFD - 1], vsp[PFD - 1], \
                             vzp[PFD - 1], vnp[PFD - 1])
#define TC_LOAD_NOW TC_LOAD(j, kwc, ksc, kzc, vwc, vsc, vzc, vnc)
  for (int j = warp; j < nch; j += NW) {
#include "tc_loads.cuh"
#include "tc_affine_scores.cuh"
#include "tc_loop_softmax.cuh"
#include "tc_affine_values.cuh"
  }
#undef TC_LOAD
#undef TC_VGROUP
#undef TC_VNORM
#include "tc_loop_merge.cuh"
