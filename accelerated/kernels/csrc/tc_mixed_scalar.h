// Both MIXED tensor-core loops' scalar splits (tc_mixed_loop.cuh, tc_mixkv_loop.cuh): splits VQ_MIX0 .. S - 1
// (partial_setup_splits.h; the rows the append encodes, one role's window beside the other's records) run in scalar
// arithmetic with the window split (tc_mixed_split.h, over xt0 .. xt1 - 1): no mma chunk there.
  const bool is_mix = VQ_MIXED && s >= VQ_MIX0 && !is_win;
  const int xt0 = t0;
  const int xt1 = t1;
  if (is_mix) {
    t1 = t0;
  }
