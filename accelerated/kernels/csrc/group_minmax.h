// f_lo[e], f_hi[e] = min and max over the KIVI / mlx_affine channel group holding slot e (groups of gs
// consecutive coordinates: gs / LW whole slots, or aligned groups of gs lanes when gs < LW).

    const int gsl = gs > LW ? gs / LW : 1;      // slots per group
    const int gl = gs < LW ? gs : LW;           // lanes per group
    float f_lo[E];
    float f_hi[E];
    for (int e = 0; e < E; ++e) {
      f_lo[e] = f_x[e];
      f_hi[e] = f_x[e];
    }
    for (int e = 1; e < E; ++e) {
      if (e % gsl != 0) {
        f_lo[e] = MINF(f_lo[e - 1], f_lo[e]);
        f_hi[e] = MAXF(f_hi[e - 1], f_hi[e]);
      }
    }
    for (int e = E - 2; e >= 0; --e) {
      if ((e + 1) % gsl != 0) {
        f_lo[e] = f_lo[e + 1];
        f_hi[e] = f_hi[e + 1];
      }
    }
    for (int s = gl >> 1; s > 0; s >>= 1) {
      for (int e = 0; e < E; ++e) {
        const float f_ol = SHFL_XOR(f_lo[e], s);
        const float f_oh = SHFL_XOR(f_hi[e], s);
        f_lo[e] = MINF(f_lo[e], f_ol);
        f_hi[e] = MAXF(f_hi[e], f_oh);
      }
    }
