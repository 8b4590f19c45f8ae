    // prod values (tc_two_setup.cuh): the sketch part's P'' = p * n gamma A_d * fv2, fv2 set and lowered as fv
    // (from the chunk's largest factor), o2 rescaled with alpha and its own fv2 change
    if (MV == 3) {
      float cv2 = vq_max(vq_max(fabsf(vnc2[0]), fabsf(vnc2[1])), vq_max(fabsf(vnc2[2]), fabsf(vnc2[3])));
      cv2 = vq_max(cv2, SHFL_XOR(cv2, 1));
      cv2 = vq_max(cv2, SHFL_XOR(cv2, 2));
      float rs2 = 1.0f;
      if (fv2 == 0.0f || cv2 * fv2 >= 2048.0f) {
        const float fn = vq_pow2_for(cv2, 11);
        rs2 = (fv2 == 0.0f) ? 1.0f : fn / fv2;
        fv2 = fn;
      }
      if (VQ_ANY(alpha != 1.0f) || rs2 != 1.0f) {
        const float bl0 = SHFL_IDX(alpha, 4 * ((2 * tig) & 3)) * rs2;
        const float bl1 = SHFL_IDX(alpha, 4 * ((2 * tig + 1) & 3)) * rs2;
        for (int mt = 0; mt < (MV == 3 ? MT : 1); ++mt) {
          o2[mt][0] *= bl0;
          o2[mt][1] *= bl1;
          o2[mt][2] *= bl0;
          o2[mt][3] *= bl1;
        }
      }
    }
