  // a second code stream (tc_two_setup.cuh): both tables' entries add in one accumulator, so one scale covers both
  if (MK == 1) {
    mtk = vq_max(mtk, fabsf(rk2));
  }
  if (MV == 1) {
    mtv = vq_max(mtv, fabsf(rv2));
  }
