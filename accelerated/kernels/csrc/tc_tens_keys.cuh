// tc_loop_scores.cuh's 4 key codes of k-step ks with a 3-bit role (tc_tens_sizes.cuh): 3-bit codes 4 ks .. 4 ks + 3
// one at a time from the realigned words (they may lie in two), else tc_words_keys.cuh's one word.
        const uint32_t w = kwc[nt][(4 * KB1 * ks) / 32] >> ((4 * KB1 * ks) % 32);
#define VQ_TC_K3(i) (VQ_TC_ALIGN(kwc[nt], KWL, (i) / 10, ksh) >> (3 * ((i) % 10)))
        const uint32_t e0 = SHFL_IDX(tabk, (KB1 == 3) ? VQ_TC_K3(4 * ks) : w);
        const uint32_t e1 = SHFL_IDX(tabk, (KB1 == 3) ? VQ_TC_K3(4 * ks + 1) : w >> KB1);
        const uint32_t e2 = SHFL_IDX(tabk, (KB1 == 3) ? VQ_TC_K3(4 * ks + 2) : w >> (2 * KB1));
        const uint32_t e3 = SHFL_IDX(tabk, (KB1 == 3) ? VQ_TC_K3(4 * ks + 3) : w >> (3 * KB1));
#undef VQ_TC_K3
