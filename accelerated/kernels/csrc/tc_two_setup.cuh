// tc_loop.cuh with a second code stream: turboquant_rvq's codes2 (MK / MV = 1, the residual table, into the same
// accumulators) or turboquant_prod's QJL signs (MK = 3: against the projected query sq2, into scores of their own
// with the factor gamma A_d; MV = 3: sums of their own, o2, the output's sketch-domain part; attention_tc.py). Its
// words per lane (the first stream's layout at width KB2 / VB2), table, row bases, register sets and loads.
  constexpr bool K2 = MK == 1 || MK == 3;
  constexpr bool V2 = MV == 1 || MV == 3;
  constexpr int KWL2 = K2 ? (KB2 * D) / 128 : 1;
  constexpr bool VWHOLE2 = VB2 * D >= 256;
  constexpr int VWL2 = (V2 && VWHOLE2) ? (VB2 * D) / 256 : 1;
  constexpr int PFD2 = (PF > 0) ? PF : 1;
  // rvq: the table scaled as the first stream's (ftk, ftv: tc_two_max.cuh); prod: the signs +-1 as they are
  const float tk2 = (MK == 3) ? rk2 : rk2 * ftk;
  const float tv2 = (MV == 3) ? rv2 : rv2 * ftv;
  const uint32_t tabk2 = vq_h2(tk2, tk2 - vq_hround(tk2));
  const uint32_t tabv2 = vq_h2(tv2, tv2 - vq_hround(tv2));
  const DEVICE uint32_t* kbase2 = K2 ? kc2 + (int64_t)b * kc2_strides[0] + (int64_t)h * kc2_strides[1] + KWL2 * tig
                                     : kc2;
  const int vsh2 = VWHOLE2 ? 0 : (g * (D / 8) * VB2) % 32;
  const DEVICE uint32_t* vbase2 = V2 ? vc2 + (int64_t)b * vc2_strides[0] + (int64_t)h * vc2_strides[1]
                                       + (VWHOLE2 ? VWL2 * g : (g * (D / 8) * VB2) / 32) : vc2;
  // the stream's register sets beside the first's (current and prefetched: attention.py _tc_prefetch lowers the
  // depth where both streams' words would hold more registers than turboquant b4's at tuning's depth)
  uint32_t kwc2[2][KWL2], vwc2[4][VWL2], kwp2[PFD2][2][KWL2], vwp2[PFD2][4][VWL2];
  float knc2[4], knp2[PFD2][4], vnc2[4], vnp2[PFD2][4];     // prod: a key's gamma A_d, a value's n gamma A_d
  const int64_t kso3 = (MK == 3) ? (int64_t)b * ks1_strides[0] + (int64_t)h * ks1_strides[1] : 0;
  const int64_t vso3 = (MV == 3) ? (int64_t)b * vs1_strides[0] + (int64_t)h * vs1_strides[1] : 0;
  // prod values: the sketch part's sums (as o) and their P'' scale (as fv: tc_two_softmax.cuh)
  float o2[MV == 3 ? MT : 1][4];
  for (int mt = 0; mt < (MV == 3 ? MT : 1); ++mt) {
    for (int i = 0; i < 4; ++i) {
      o2[mt][i] = 0.0f;
    }
  }
  float fv2 = 0.0f;
  // prod: the projected query rows' fragments (as qa, from sq2, with their own power-of-two scale fqb)
  float fqb = 1.0f;
  uint32_t qb2[MK == 3 ? KS : 1][2];
  if (MK == 3) {
#define VQ_TC_Q sq2
#define VQ_TC_FQ fqb
#define VQ_TC_QA(ks) qb2[ks % (MK == 3 ? KS : 1)]
#include "tc_query_scale.cuh"
#include "tc_query_frag.cuh"
  }
  const float ukb = 1.0f / fqb;           // exact: a power of two
  float sc2[2][4];                        // prod: a chunk's QJL scores
#define TC_KEYS2(T, W) if (K2) { vq_words<KWL2>(kbase2 + (T) * kc2_strides[2], (W)); }
#define TC_VALUES2(T, W) if (V2) { vq_words<VWL2>(vbase2 + (T) * vc2_strides[2], (W)); }
#define TC_KNORM2(T, N) if (MK == 3) { (N) = ks1[kso3 + (T) * ks1_strides[2]] * f_k[1]; }
#define TC_VNORM2(T, N) \
  if (MV == 3) { (N) = vs0[vso + (T) * vs0_strides[2]] * (vs1[vso3 + (T) * vs1_strides[2]] * f_k[1]); }
