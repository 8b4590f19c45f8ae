// tc_loop_scores.cuh's n-tile loop unrolled (tc_prod3: prod keys' signs beside a 3-bit role's realigned words, where
// nvcc left it rolled and indexed the key words and scores at run time, in local memory)
    VQ_UNROLL
