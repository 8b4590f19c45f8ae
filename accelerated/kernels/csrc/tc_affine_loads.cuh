// tc_affine_loop.cuh's loads of one chunk: the prefetched register sets taken and shifted down (PFA > 0), or loaded now
    if (PFA > 0) {
      for (int nt = 0; nt < 2; ++nt) {
        for (int i = 0; i < KWL; ++i) {
          kwc[nt][i] = kwp[0][nt][i];
        }
        ksc[nt] = ksp[0][nt];
        kzc[nt] = kzp[0][nt];
      }
      for (int x = 0; x < 4; ++x) {
        for (int i = 0; i < VWL; ++i) {
          vwc[x][i] = vwp[0][x][i];
        }
        vsc[x] = vsp[0][x];
        vzc[x] = vzp[0][x];
        vnc[x] = vnp[0][x];
      }
      for (int q = 0; q + 1 < PFA; ++q) {
        for (int nt = 0; nt < 2; ++nt) {
          for (int i = 0; i < KWL; ++i) {
            kwp[q][nt][i] = kwp[q + 1][nt][i];
          }
          ksp[q][nt] = ksp[q + 1][nt];
          kzp[q][nt] = kzp[q + 1][nt];
        }
        for (int x = 0; x < 4; ++x) {
          for (int i = 0; i < VWL; ++i) {
            vwp[q][x][i] = vwp[q + 1][x][i];
          }
          vsp[q][x] = vsp[q + 1][x];
          vzp[q][x] = vzp[q + 1][x];
          vnp[q][x] = vnp[q + 1][x];
        }
      }
      if (j + PFA * NW < nch) {
        TC_LOAD(j + PFA * NW, kwp[PFD - 1], ksp[PFD - 1], kzp[PFD - 1], vwp[PFD - 1], vsp[PFD - 1], vzp[PFD - 1],
                vnp[PFD - 1])
      }
    } else {
      TC_LOAD(j, kwc, ksc, kzc, vwc, vsc, vzc, vnc)
    }
