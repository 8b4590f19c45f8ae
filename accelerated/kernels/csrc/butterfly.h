// H over f_BF_ARR (rotation.md; H_m^T in stage B of decode): stage A, h = 1, 2, ..., NB/2 ascending on each
// block, then stage B (RM > 1). Parameter: f_BF_ARR.

    for (int hh = 1; hh < LW; hh <<= 1) {
      // lane with bit h clear: lo + hi (its own + the partner's); set: lo - hi = lo + (-hi), exactly
      const uint32_t hm = (lane & hh) != 0 ? 0x80000000u : 0u;
      for (int e = 0; e < E; ++e) {
        const float f_o = SHFL_XOR(f_BF_ARR[e], hh);
        f_BF_ARR[e] = ADD(f_o, FLIP(f_BF_ARR[e], hm));
      }
    }
    for (int hs = 1; hs < EN; hs <<= 1) {     // inside each block: e and e + hs share a block
      for (int e = 0; e < E; ++e) {
        if ((e & hs) == 0) {
          const float f_lo = f_BF_ARR[e];
          const float f_hi = f_BF_ARR[e + hs];
          f_BF_ARR[e] = ADD(f_lo, f_hi);
          f_BF_ARR[e + hs] = SUB(f_lo, f_hi);
        }
      }
    }
    if (RM > 1) {
      // stage B: at each position (slot offset ei of every block), out block j = sum over k of
      // +-block k, left to right from +0, the sign from bit k of row j (every block read before any write).
      // Unrolled (compilers stop short at 20 or 28), so the signs are constants and f_sb stays in registers.
      #pragma unroll
      for (int ei = 0; ei < EN; ++ei) {
        float f_sb[RM];
        #pragma unroll
        for (int jj = 0; jj < RM; ++jj) {
          const uint32_t hrow = RM == 12 ? hm12[jj] : RM == 20 ? hm20[jj] : hm28[jj];
          float f_acc = 0.0f;
          #pragma unroll
          for (int k = 0; k < RM; ++k) {
            const float f_bk = f_BF_ARR[k * EN + ei];
            f_acc = ((hrow >> k) & 1u) != 0u ? SUB(f_acc, f_bk) : ADD(f_acc, f_bk);
          }
          f_sb[jj] = f_acc;
        }
        #pragma unroll
        for (int jj = 0; jj < RM; ++jj) {
          f_BF_ARR[jj * EN + ei] = f_sb[jj];
        }
      }
    }
#undef f_BF_ARR
