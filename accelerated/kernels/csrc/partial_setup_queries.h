// partial_setup.h's step 1: the group's query rows scaled, rotated into the keys' domain (sq, sq2), held in qr, qr2.
  // 1. the group's query rows, scaled (log2 domain), rotated into the keys' domain (encoded splits)
  SHARED(float, sq, QB * D);
  SHARED(float, sq2, QB * D);
  VQ_COLD
  for (int i = tid; i < QB * D; i += NT) {
    const int r = qg * QB + i / D;
    float v = 0.0f;
    if (r < nq) {
      const int head = h * rep + r / L;
      const int pos = r % L;
      v = static_cast<float>(q[(int64_t)b * q_strides[0] + (int64_t)head * q_strides[1]
                               + (int64_t)pos * q_strides[2] + (int64_t)(i % D) * q_strides[3]]) * f_scale[0];
      if (KROT && !is_win) {
        v = v * f_ksig[h * D + i % D];
      }
    }
    sq[i] = v;
  }
  BARRIER();
  if (KROT && !is_win) {
    // H by ascending butterfly stages, then s_d (rotation.md); tau's RHT on top for turboquant_prod
    for (int pass = 0; pass < KPARTS; ++pass) {
      if (pass == 1) {
        VQ_COLD
        for (int i = tid; i < QB * D; i += NT) {
          sq2[i] = sq[i] * f_ktau[h * D + i % D];
        }
        BARRIER();
      }
      TGMEM float* rows = (pass == 0) ? sq : sq2;
      VQ_COLD
      for (int hh = 1; hh < D; hh <<= 1) {
        vq_butterfly_stage<D>(rows, QB, hh, tid, NT);
        BARRIER();
      }
      VQ_COLD
      for (int i = tid; i < QB * D; i += NT) {
        rows[i] = rows[i] * f_k[0];
      }
      BARRIER();
    }
  }
  float qr[QB][NC];
  float qr2[KPARTS == 2 ? QB : 1][KPARTS == 2 ? NC : 1];
  for (int r = 0; r < QB; ++r) {
    for (int k = 0; k < NCH; ++k) {
      for (int j = 0; j < 8; ++j) {
        const int c = (lp + k * P) * 8 + j;
        qr[r][k * 8 + j] = sq[r * D + c];
        if (KPARTS == 2) {
          qr2[r % (KPARTS == 2 ? QB : 1)][(k * 8 + j) % (KPARTS == 2 ? NC : 1)] = sq2[r * D + c];
        }
      }
    }
  }
  // causal: query row r sits at position T - L + r % L and sees tokens at positions <= it
  int qpos[QB];
  for (int r = 0; r < QB; ++r) {
    qpos[r] = CAUSAL ? (T - L + (qg * QB + r) % L) : T;
  }
