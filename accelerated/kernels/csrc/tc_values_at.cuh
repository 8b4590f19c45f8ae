// Where a lane group's value codes of m-tile mt lie (tc_words_values.cuh, tc_tens_values.cuh, tc_kivi_values.cuh,
// tc_affine_values.cuh): coordinate g * D / 8 + mt in word wa at bit sa, g * D / 8 + D / 16 + mt in wb at sb. Below
// 32 bits a group (VWL = 1) the group's codes lie in its one word: index 0 written as a constant, since an index
// through the run-time vsh put vwc in local memory (60 loads per chunk for rabitq, sm_90).
      const int wa = VWHOLE ? (VB1 * mt) / 32 : 0;
      const int sa = VWHOLE ? (VB1 * mt) % 32 : vsh + VB1 * mt;
      const int wb = VWHOLE ? (VB1 * (D / 16 + mt)) / 32 : 0;
      const int sb = VWHOLE ? (VB1 * (D / 16 + mt)) % 32 : vsh + VB1 * (D / 16 + mt);
