// tc_loop_scores.cuh's 4 key codes of k-step ks, table entries e0 .. e3 (tc_words_sizes.cuh's layout).
        const uint32_t w = kwc[nt][(4 * KB1 * ks) / 32] >> ((4 * KB1 * ks) % 32);
        const uint32_t e0 = SHFL_IDX(tabk, w);
        const uint32_t e1 = SHFL_IDX(tabk, w >> KB1);
        const uint32_t e2 = SHFL_IDX(tabk, w >> (2 * KB1));
        const uint32_t e3 = SHFL_IDX(tabk, w >> (3 * KB1));
