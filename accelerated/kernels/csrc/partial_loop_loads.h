// partial_loop.h's loads of one iteration: the words loaded ahead (KPRE, VPRE), from the prefetch (PF) or now.
    if ((KPRE || VPRE) && !is_win) {
      if (PF) {
        for (int u = 0; u < U; ++u) {
          for (int k = 0; k < NCH; ++k) {
            pk1[u % KU][k % KN] = nk1[u % KU][k % KN];
            pk2[u % KU][k % KN] = nk2[u % KU][k % KN];
            pv1[u % VU][k % VN] = nv1[u % VU][k % VN];
            pv2[u % VU][k % VN] = nv2[u % VU][k % VN];
          }
          pks0[u % KU] = nks0[u % KU];
          pks1[u % KU] = nks1[u % KU];
          pvs0[u % VU] = nvs0[u % VU];
          pvs1[u % VU] = nvs1[u % VU];
        }
        if (it + 1 < n_it) {
          VQ_LOAD(it + 1, nk1, nk2, nks0, nks1, nv1, nv2, nvs0, nvs1)
        }
      } else {
        VQ_LOAD(it, pk1, pk2, pks0, pks1, pv1, pv2, pvs0, pvs1)
      }
    }
