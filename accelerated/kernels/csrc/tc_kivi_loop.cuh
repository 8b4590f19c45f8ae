// Steps 3-4 of the partial kernel on tensor cores for KIVI records (attention_tc.py; tc_loop.cuh's structure).

#include "tc_kivi_setup.cuh"
#include "tc_vgroup.cuh"
  // one chunk's loads (tokens outside t0 .. t1 - 1 read token t0's rows: those below t0 may be a row start's
  // unwritten rows, and a NaN value times p = 0 is NaN): key words as tc_loop.cuh; per value slot x the token's words, its scale VS and zero VZ
  // (this lane group's coordinate group) and VN: the largest |v| any lane's group can take in this chunk's
  // tokens, (2^VB1 - 1) |s| + |z| over the warp (the softmax fragment's value norm: fv puts it below 2^11)
#define TC_LOAD(J, KWD, VWD, VS, VZ, VN) { \
    const int tb_ = ta + 16 * (J); \
    for (int nt = 0; nt < 2; ++nt) { \
      const int t_ = tb_ + 8 * nt + g; \
      vq_words<KWL>(kbase + (int64_t)(t_ >= t0 && t_ < t1 ? t_ : t0) * kc1_strides[2], KWD[nt]); \
    } \
    float bd_ = 0.0f; \
    for (int x = 0; x < 4; ++x) { \
      const int t_ = tb_ + 8 * (x >> 1) + 2 * tig + (x & 1); \
      const int64_t tt_ = (t_ >= t0 && t_ < t1) ? t_ : t0; \
      vq_words<VWL>(vbase + tt_ * vc1_strides[2], VWD[x]); \
      TC_VGROUP(VS, VZ) \
    } \
    TC_VNORM(VN) }
  constexpr int PFD = (PF > 0) ? PF : 1;
  uint32_t kwc[2][KWL], vwc[4][VWL], kwp[PFD][2][KWL], vwp[PFD][4][VWL];
  float vsc[4], vzc[4], vnc[4], vsp[PFD][4], vzp[PFD][4], vnp[PFD][4];
  // a warp's chunks: KP consecutive ones (one key group, tc_kivi_setup.cuh), then KP * NW further on (KP = 1: warp,
  // warp + NW, ...); KP divides PF, so the chunk PF places ahead is still j + PF * NW (tc_loads.cuh)
  for (int q = 0; q < PF; ++q) {
    const int jq = (q / KP) * (KP * NW) + KP * warp + q % KP;
    if (jq < nch) {
      TC_LOAD(jq, kwp[q], vwp[q], vsp[q], vzp[q], vnp[q])
    }
  }
  // tc_loads.cuh's parameters: the side registers each key and value slot takes and shifts
#define TC_PF PF
#define TC_KSIDES(F, i)
#define TC_XSIDES(F, i) F(vs, i) F(vz, i) F(vn, i)
#define TC_LOAD_NEXT TC_LOAD(j + PF * NW, kwp[PFD - 1], vwp[PFD - 1], vsp[PFD - 1], vzp[PFD - 1], vnp[PFD - 1])
#define TC_LOAD_NOW TC_LOAD(j, kwc, vwc, vsc, vzc, vnc)
  for (int j = KP * warp; j < nch; j += (j % KP == KP - 1) ? KP * NW - KP + 1 : 1) {
#include "tc_loads.cuh"
#include "tc_kivi_scores.cuh"
#include "tc_loop_softmax.cuh"
#include "tc_kivi_values.cuh"
  }
#undef TC_LOAD
#undef TC_VGROUP
#undef TC_VNORM
#include "tc_loop_merge.cuh"
