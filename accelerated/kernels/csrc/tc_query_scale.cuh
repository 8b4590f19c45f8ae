// VQ_TC_FQ: the power of two that puts this lane's query row ra of VQ_TC_Q near 2^11 (the includer's #defines, and
// VQ_TC_FQ declared 1: tc_loop_setup.cuh and tc_affine_setup.cuh the query sq, tc_two_setup.cuh the projected sq2).
  for (int r = 0; r < QB; ++r) {
    float mx = 0.0f;
    for (int c = lane; c < D; c += 32) {
      mx = vq_max(mx, fabsf(VQ_TC_Q[r * D + c]));
    }
    for (int o = 16; o > 0; o >>= 1) {
      mx = vq_max(mx, SHFL_XOR(mx, o));
    }
    VQ_TC_FQ = (r == ra) ? vq_pow2_for(mx, 11) : VQ_TC_FQ;
  }
