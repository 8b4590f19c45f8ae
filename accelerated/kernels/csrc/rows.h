// Loop over this warp's rows: rows r = (b * nh + h) * VQ_ROWS_PER + i (VQ_ROWS_N in all) in one contiguous
// chunk per warp, walked as segments of one (b, h): the head's sign bits (sgb, tab) loaded once per segment,
// (i, h, b) advanced without a division per row. The loop body ends with rows_end.h.

  const uint32_t uper = (VQ_ROWS_PER) > 0 ? (uint32_t)(VQ_ROWS_PER) : 1u;   // no division by 0 when there are no rows
  const uint32_t unh = nh > 0 ? (uint32_t)nh : 1u;
  const uint32_t nrows = (uint32_t)(VQ_ROWS_N);
  const uint32_t nwall = (uint32_t)NGROUPS * (uint32_t)nwarps;
  const uint32_t chunk = (nrows + nwall - 1u) / nwall;
  const uint32_t rbeg = ((uint32_t)GROUP * (uint32_t)nwarps + (uint32_t)warp) * chunk;
  const uint32_t rend = rbeg + chunk < nrows ? rbeg + chunk : nrows;
  uint32_t ui = rbeg % uper;
  uint32_t ubh = rbeg / uper;
  uint32_t uh = ubh % unh;
  uint32_t ub = ubh / unh;
  uint32_t sgb = 0u;                            // sign bits of the segment's head: sigma, tau
  uint32_t tab = 0u;
  for (uint32_t r0 = rbeg; r0 < rend; ) {
    const uint32_t rs = uper - ui < rend - r0 ? r0 + (uper - ui) : rend;   // this (b, h)'s rows: r0 .. rs-1
    const int h = (int)uh;
    const int bh = (int)ubh;
    const int b = (int)ub;

    if (M <= 3) {
      sgb = 0u;
      tab = 0u;
      for (int e = 0; e < E; ++e) {
        const int j = lane + LW * e;
        sgb |= ((sig[(h) * WS + (j >> 5)] >> (j & 31)) & 1u) << e;
        if (M == 3) {
          tab |= ((tau[(h) * WS + (j >> 5)] >> (j & 31)) & 1u) << e;
        }
      }
    }

  for (uint32_t r = r0; r < rs; ++r) {
    const int i = (int)(ui + (r - r0));
#undef VQ_ROWS_PER
#undef VQ_ROWS_N
