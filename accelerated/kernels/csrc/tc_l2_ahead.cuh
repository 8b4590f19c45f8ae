// tc_loop.cuh's L2 prefetch (tuning's tc_l2_prefetch: its launch's header defines VQ_TCL2 and vq_l2, csrc/tc_l2.cuh):
// TC_L2_NEXT(j) asks the lines that the warp's chunk VQ_TCL2 ahead of chunk j loads into L2 (TC_LOAD's rows; the
// second streams' through TC_L2K2 / TC_L2V2: tc_stage1.cuh, tc_two_setup.cuh), no register held until the load
// (prod's values loop has PF = 0: each chunk loaded at its start); the warp's chunks 1 .. VQ_TCL2 - 1 are asked for
// here. Without the knob both are nothing.
#if defined(VQ_TCL2) && VQ_TCL2 > 0
#define TC_L2_AHEAD(J) { \
    const int tb_ = t0 + 16 * (J); \
    for (int nt = 0; nt < 2; ++nt) { \
      const int64_t t_ = tb_ + 8 * nt + g; \
      if (t_ < t1) { vq_l2(kbase + t_ * kc1_strides[2]); TC_L2K2(t_) } \
    } \
    for (int x = 0; x < 4; ++x) { \
      const int64_t t_ = tb_ + 8 * (x >> 1) + 2 * tig + (x & 1); \
      if (t_ < t1) { \
        vq_l2(vbase + t_ * vc1_strides[2]); \
        TC_L2V2(t_) \
        vq_l2(ks0 + kso + t_ * ks0_strides[2]); \
        vq_l2(vs0 + vso + t_ * vs0_strides[2]); \
      } \
    } }
#define TC_L2_NEXT(j) if ((j) + VQ_TCL2 * NW < nch) { TC_L2_AHEAD((j) + VQ_TCL2 * NW) }
  for (int q = 1; q < VQ_TCL2; ++q) {
    if (warp + q * NW < nch) {
      TC_L2_AHEAD(warp + q * NW)
    }
  }
#else
#define TC_L2_AHEAD(J)
#define TC_L2_NEXT(j)
#endif
