      // the second stream (tc_two_setup.cuh) in its own table: rvq's into the same sums (the same P'), prod's signs
      // into o2 with P'' = p * n gamma A_d * fv2 (the signs exact in float16: one mma)
      if (MV == 1 || MV == 3) {
        const int wa2 = VWHOLE2 ? (VB2 * mt) / 32 : 0;
        const int sa2 = VWHOLE2 ? (VB2 * mt) % 32 : vsh2 + VB2 * mt;
        const int wb2 = VWHOLE2 ? (VB2 * (D / 16 + mt)) / 32 : 0;
        const int sb2 = VWHOLE2 ? (VB2 * (D / 16 + mt)) % 32 : vsh2 + VB2 * (D / 16 + mt);
        VQ_TC_VENTRIES(c, d, tabv2, vwc2, wa2, sa2, wb2, sb2)
        if (MV == 1) {
          vq_mma(o[mt], vq_perm(c0, c1, 0x5410u), vq_perm(d0, d1, 0x5410u), vq_perm(c2, c3, 0x5410u),
                 vq_perm(d2, d3, 0x5410u), p0, p1);
          vq_mma(o[mt], vq_perm(c0, c1, 0x7632u), vq_perm(d0, d1, 0x7632u), vq_perm(c2, c3, 0x7632u),
                 vq_perm(d2, d3, 0x7632u), p0, p1);
        } else {
          float ub[4];
          for (int x = 0; x < 4; ++x) {
            ub[x] = pa[x] * vnc2[x] * fv2;
            if (part == 1) {
              ub[x] -= vq_hround(ub[x]);
            }
          }
          vq_mma(o2[mt % (MV == 3 ? MT : 1)], vq_perm(c0, c1, 0x5410u), vq_perm(d0, d1, 0x5410u),
                 vq_perm(c2, c3, 0x5410u), vq_perm(d2, d3, 0x5410u), vq_h2(ub[0], ub[1]), vq_h2(ub[2], ub[3]));
        }
      }
