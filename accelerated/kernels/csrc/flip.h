// f_FLIP_DST[e] = f_FLIP_SRC[e] * sigma_j (exact: a sign flip where bit e of the lane's cached sign bits
// VQ_FLIP_BITS is set).

    for (int e = 0; e < E; ++e) {
      const uint32_t fm = (VQ_FLIP_BITS << (31 - e)) & 0x80000000u;
      f_FLIP_DST[e] = FLIP(f_FLIP_SRC[e], fm);
    }
#undef VQ_FLIP_BITS
#undef f_FLIP_SRC
#undef f_FLIP_DST
