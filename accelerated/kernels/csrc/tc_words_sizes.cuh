// tc_loop_setup.cuh's code words per lane (tc_words_*: codes in whole words, or part of one, at 1, 2 or 4 bits;
// tc_tens_sizes.cuh with a 3-bit role) and the loads of a token's words in TC_LOAD. The KIVI and mlx_affine setups
// take its sizes (their loops load words with vq_words directly).
  constexpr int KWL = (KB1 * D) / 128;    // key words per lane and token (4 codes per k-step, D / 4 coordinates)
  constexpr bool VWHOLE = VB1 * D >= 256; // a lane group's D / 8 value codes are whole words (else part of one)
  constexpr int VWL = VWHOLE ? (VB1 * D) / 256 : 1;                  // value words per lane group (D / 8 codes)
#define VQ_TC_KWORDS(p, out) vq_words<KWL>(p, out)
#define VQ_TC_VWORDS(p, out) vq_words<VWL>(p, out)
