// tc_mixed_loop.cuh's loads of one chunk: the prefetched register sets taken and shifted down (PF > 0), or loaded now.
    if (PF > 0) {
      for (int nt = 0; nt < 2; ++nt) {
        for (int i = 0; i < KWL; ++i) {
          kwc[nt][i] = kwp[0][nt][i];
        }
      }
      for (int x = 0; x < 4; ++x) {
        for (int i = 0; i < VWL; ++i) {
          vwc[x][i] = vwp[0][x][i];
        }
        knc[x] = knp[0][x];
        vsc[x] = vsp[0][x];
        vzc[x] = vzp[0][x];
        vnc[x] = vnp[0][x];
      }
      for (int q = 0; q + 1 < PF; ++q) {
        for (int nt = 0; nt < 2; ++nt) {
          for (int i = 0; i < KWL; ++i) {
            kwp[q][nt][i] = kwp[q + 1][nt][i];
          }
        }
        for (int x = 0; x < 4; ++x) {
          for (int i = 0; i < VWL; ++i) {
            vwp[q][x][i] = vwp[q + 1][x][i];
          }
          knp[q][x] = knp[q + 1][x];
          vsp[q][x] = vsp[q + 1][x];
          vzp[q][x] = vzp[q + 1][x];
          vnp[q][x] = vnp[q + 1][x];
        }
      }
      if (j + PF * NW < nch) {
        TC_LOAD(j + PF * NW, kwp[PFD - 1], knp[PFD - 1], vwp[PFD - 1], vsp[PFD - 1], vzp[PFD - 1], vnp[PFD - 1])
      }
    } else {
      TC_LOAD(j, kwc, knc, vwc, vsc, vzc, vnc)
    }
