// fqa: the power of two that puts this lane's query row ra (sq) near 2^11 (tc_loop_setup.cuh, tc_affine_setup.cuh).
  float fqa = 1.0f;
  for (int r = 0; r < QB; ++r) {
    float mx = 0.0f;
    for (int c = lane; c < D; c += 32) {
      mx = vq_max(mx, fabsf(sq[r * D + c]));
    }
    for (int o = 16; o > 0; o >>= 1) {
      mx = vq_max(mx, SHFL_XOR(mx, o));
    }
    fqa = (r == ra) ? vq_pow2_for(mx, 11) : fqa;
  }
