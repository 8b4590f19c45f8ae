// tc_loop_setup.cuh's row bases with a 3-bit role (tc_tens_sizes.cuh): the word of a lane's first key code and of
// its group's first value code, that code's bit in it (ksh, vsh) and the last word of the row from there (klim, vlim).
  const int kc0 = tig * (D / 4);
  const int vc0 = g * (D / 8);
  const int ksh = 3 * (kc0 % 10);
  const int klim = (D + 9) / 10 - 1 - kc0 / 10;
  const int vlim = (D + 9) / 10 - 1 - vc0 / 10;
  const DEVICE uint32_t* kbase = kc1 + (int64_t)b * kc1_strides[0] + (int64_t)h * kc1_strides[1]
                                 + ((KB1 == 3) ? kc0 / 10 : KWL * tig);
  // (1, 2 or 4 bits) a group's codes in whole words, or part of one from bit vsh (tc_words_bases.cuh)
  const int vsh = (VB1 == 3) ? 3 * (vc0 % 10) : VWHOLE ? 0 : (g * (D / 8) * VB1) % 32;
  const DEVICE uint32_t* vbase = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1]
                                 + ((VB1 == 3) ? vc0 / 10 : VWHOLE ? VWL * g : (g * (D / 8) * VB1) / 32);
