      // the second stream's register sets (tc_two_setup.cuh), taken and shifted down as the first's
      for (int nt = 0; nt < 2; ++nt) {
        for (int i = 0; i < KWL2; ++i) {
          kwc2[nt][i] = kwp2[0][nt][i];
        }
      }
      for (int x = 0; x < 4; ++x) {
        for (int i = 0; i < VWL2; ++i) {
          vwc2[x][i] = vwp2[0][x][i];
        }
      }
      for (int q = 0; q + 1 < PF; ++q) {
        for (int nt = 0; nt < 2; ++nt) {
          for (int i = 0; i < KWL2; ++i) {
            kwp2[q][nt][i] = kwp2[q + 1][nt][i];
          }
        }
        for (int x = 0; x < 4; ++x) {
          for (int i = 0; i < VWL2; ++i) {
            vwp2[q][x][i] = vwp2[q + 1][x][i];
          }
        }
      }
      // prod: the tokens' gamma A_d, taken and shifted as the norms
      for (int x = 0; x < 4; ++x) {
        knc2[x] = knp2[0][x];
        for (int q = 0; q + 1 < PF; ++q) {
          knp2[q][x] = knp2[q + 1][x];
        }
      }
      // prod values: the tokens' n gamma A_d, taken and shifted as the norms
      for (int x = 0; x < 4; ++x) {
        vnc2[x] = vnp2[0][x];
        for (int q = 0; q + 1 < PF; ++q) {
          vnp2[q][x] = vnp2[q + 1][x];
        }
      }
