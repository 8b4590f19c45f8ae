// tc_loop_setup.cuh's row bases of a lane's key words and its lane group's value words (tc_words_sizes.cuh).
  const DEVICE uint32_t* kbase = kc1 + (int64_t)b * kc1_strides[0] + (int64_t)h * kc1_strides[1] + KWL * tig;
  // a lane group's D / 8 value codes start at bit g * D / 8 * VB1 of the row: whole words at 4 bits, part of
  // one below 32 bits a group (vsh: the group's first bit in its word)
  const int vsh = VWHOLE ? 0 : (g * (D / 8) * VB1) % 32;
  const DEVICE uint32_t* vbase = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1]
                                 + (VWHOLE ? VWL * g : (g * (D / 8) * VB1) / 32);
