// A value pass's probabilities as the B operand p0, p1 (tc_loop_values.cuh, tc_kivi_values.cuh, tc_affine_values.cuh):
// P' = p VQ_TC_PSCALE (the includer's #define), its hi part, or with part 1 its lo part.
    float ua[4];
    for (int x = 0; x < 4; ++x) {
      ua[x] = pa[x] * VQ_TC_PSCALE;
      if (part == 1) {
        ua[x] -= vq_hround(ua[x]);
      }
    }
    const uint32_t p0 = vq_h2(ua[0], ua[1]);
    const uint32_t p1 = vq_h2(ua[2], ua[3]);
#undef VQ_TC_PSCALE
