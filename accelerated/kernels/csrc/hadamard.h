// H_m (or H_m^T) for m = 12, 20, 28 as constant row masks (bit k set where entry (j, k) is -1), compiled in so
// that stage B's signs are constants after unrolling. Parameters: VQ_HM12, VQ_HM20, VQ_HM28 (the rows).
  const uint32_t hm12[12] = {VQ_HM12};
  const uint32_t hm20[20] = {VQ_HM20};
  const uint32_t hm28[28] = {VQ_HM28};
#undef VQ_HM12
#undef VQ_HM20
#undef VQ_HM28
