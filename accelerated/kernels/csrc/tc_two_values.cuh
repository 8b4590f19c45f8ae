      // the second stream (tc_two_setup.cuh): its codes in its own table, into the same sums (the same P')
      if (MV == 1) {
        const int wa2 = VWHOLE2 ? (VB2 * mt) / 32 : 0;
        const int sa2 = VWHOLE2 ? (VB2 * mt) % 32 : vsh2 + VB2 * mt;
        const int wb2 = VWHOLE2 ? (VB2 * (D / 16 + mt)) / 32 : 0;
        const int sb2 = VWHOLE2 ? (VB2 * (D / 16 + mt)) % 32 : vsh2 + VB2 * (D / 16 + mt);
        const uint32_t c0 = SHFL_IDX(tabv2, vwc2[0][wa2] >> sa2);
        const uint32_t c1 = SHFL_IDX(tabv2, vwc2[1][wa2] >> sa2);
        const uint32_t c2 = SHFL_IDX(tabv2, vwc2[2][wa2] >> sa2);
        const uint32_t c3 = SHFL_IDX(tabv2, vwc2[3][wa2] >> sa2);
        const uint32_t d0 = SHFL_IDX(tabv2, vwc2[0][wb2] >> sb2);
        const uint32_t d1 = SHFL_IDX(tabv2, vwc2[1][wb2] >> sb2);
        const uint32_t d2 = SHFL_IDX(tabv2, vwc2[2][wb2] >> sb2);
        const uint32_t d3 = SHFL_IDX(tabv2, vwc2[3][wb2] >> sb2);
        vq_mma(o[mt], vq_perm(c0, c1, 0x5410u), vq_perm(d0, d1, 0x5410u), vq_perm(c2, c3, 0x5410u),
               vq_perm(d2, d3, 0x5410u), p0, p1);
        vq_mma(o[mt], vq_perm(c0, c1, 0x7632u), vq_perm(d0, d1, 0x7632u), vq_perm(c2, c3, 0x7632u),
               vq_perm(d2, d3, 0x7632u), p0, p1);
      }
