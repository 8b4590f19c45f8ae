// tc_loop.cuh with a second code stream (turboquant_rvq, MK / MV = 1: codes2 in the residual table; attention_tc.py):
// its words per lane (the first stream's layout at width KB2 / VB2), table, row bases, register sets and loads.
  constexpr bool K2 = MK == 1;
  constexpr bool V2 = MV == 1;
  constexpr int KWL2 = K2 ? (KB2 * D) / 128 : 1;
  constexpr bool VWHOLE2 = VB2 * D >= 256;
  constexpr int VWL2 = (V2 && VWHOLE2) ? (VB2 * D) / 256 : 1;
  constexpr int PFD2 = (PF > 0) ? PF : 1;
  // the table scaled as the first stream's (ftk, ftv: tc_two_max.cuh), hi and lo parts in one word
  const float tk2 = rk2 * ftk;
  const float tv2 = rv2 * ftv;
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
#define TC_KEYS2(T, W) if (K2) { vq_words<KWL2>(kbase2 + (T) * kc2_strides[2], (W)); }
#define TC_VALUES2(T, W) if (V2) { vq_words<VWL2>(vbase2 + (T) * vc2_strides[2], (W)); }
