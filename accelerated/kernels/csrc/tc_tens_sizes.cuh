// tc_loop_setup.cuh's code words per lane with a 3-bit role (the other role as tc_words_sizes.cuh has it). 3-bit
// codes lie 10 to a word and never straddle words (spec/packing.md), so a lane's n = D / 4 key codes (a lane
// group's D / 8 value codes), from code c0 = n tig (n g) of the row on, start at an even offset c0 % 10 <= 8 of word
// c0 / 10 and span at most (n + 17) / 10 words. Those are loaded raw (one word at a time: a row of 4 (D + 9) / 10
// bytes is not 8- or 16-byte aligned, and never past the row's last word) and realigned where a code is read.
  constexpr int KWL = (KB1 == 3) ? (D / 4 + 17) / 10 : (KB1 * D) / 128;  // key words per lane and token
  constexpr bool VWHOLE = VB1 * D >= 256; // (1, 2 or 4 bits) a lane group's value codes are whole words
  constexpr int VWL = (VB1 == 3) ? (D / 8 + 17) / 10 : VWHOLE ? (VB1 * D) / 256 : 1;    // value words per group
#define VQ_TC_KWORDS(p, out) \
  if (KB1 == 3) { for (int w_ = 0; w_ < KWL; ++w_) (out)[w_] = (p)[vq_min(w_, klim)]; } else vq_words<KWL>(p, out)
#define VQ_TC_VWORDS(p, out) \
  if (VB1 == 3) { for (int w_ = 0; w_ < VWL; ++w_) (out)[w_] = (p)[vq_min(w_, vlim)]; } else vq_words<VWL>(p, out)
// word k of the realigned codes (code i at bit 3 (i % 10) of word i / 10) from raw words R[0 .. N - 1] whose first
// code sits at bit sh: a raw word's 2 high bits are zero, so the next word's codes go in at bit 30 - sh (sh <= 24)
#define VQ_TC_ALIGN(R, N, k, sh) \
  (((R)[(k) < (N) ? (k) : 0] >> (sh)) | ((k) + 1 < (N) ? (R)[(k) + 1 < (N) ? (k) + 1 : 0] << (30 - (sh)) : 0u))
