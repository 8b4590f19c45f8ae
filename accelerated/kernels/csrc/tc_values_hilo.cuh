// A value m-tile's operands ea / fb (float32) split in float16 hi and lo parts, one mma each (tc_kivi_values.cuh,
// tc_affine_values.cuh).
      uint32_t ah[4];
      uint32_t al[4];
      for (int i = 0; i < 2; ++i) {        // a0 / a2: rows g, tokens 2i; a1 / a3: rows g + 8
        const float h0 = vq_hround(ea[2 * i]), h1 = vq_hround(ea[2 * i + 1]);
        const float k0 = vq_hround(fb[2 * i]), k1 = vq_hround(fb[2 * i + 1]);
        ah[2 * i] = vq_h2(h0, h1);
        ah[2 * i + 1] = vq_h2(k0, k1);
        al[2 * i] = vq_h2(ea[2 * i] - h0, ea[2 * i + 1] - h1);
        al[2 * i + 1] = vq_h2(fb[2 * i] - k0, fb[2 * i + 1] - k1);
      }
      vq_mma(o[mt], ah[0], ah[1], ah[2], ah[3], p0, p1);
      vq_mma(o[mt], al[0], al[1], al[2], al[3], p0, p1);
