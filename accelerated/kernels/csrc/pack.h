// Row VQ_PACK_ROW of VQ_PACK_OUT = pack(VQ_PACK_CODES[0..D-1], VQ_PACK_BITS) (packing.md); codes[e] belongs to
// j = lane + LW*e; VQ_PACK_REGION: this warp's staging region (0, 1).

    {
      const int kk = 32 / VQ_PACK_BITS;
      const int nw = (D + kk - 1) / kk;
      const int64_t ob = (int64_t)(VQ_PACK_ROW) * nw;
      if (WHOLE && VQ_PACK_BITS == 1) {
        for (int e = 0; e < E; ++e) {
          const uint32_t wv = BALLOT(act && VQ_PACK_CODES[e] != 0u);
          if (lane == 0) {
            VQ_PACK_OUT[ob + e] = LW == 32 ? wv : (wv & ((1u << LW) - 1u));
          }
        }
      } else if ((kk & (kk - 1)) == 0 && (WHOLE || LW % kk == 0)) {
        // k = 16, 8, 4 codes per word: an aligned group of k lanes fills one word of one slot
        for (int e = 0; e < E; ++e) {
          uint32_t wv = VQ_PACK_CODES[e] << (VQ_PACK_BITS * (lane & (kk - 1)));
          for (int s = 8; s > 0; s >>= 1) {         // fixed trip count; the guard is warp-uniform
            if (s < kk) {
              wv |= SHFL_XOR(wv, s);
            }
          }
          if (act && (lane & (kk - 1)) == 0) {
            // (lane + LW * e) / kk, as a row offset plus a constant per slot (kk divides LW here)
            VQ_PACK_OUT[ob + lane / kk + e * (LW / kk)] = wv;
          }
        }
      } else {
        // 3, 5, 6, 7 bits (and 1, 2, 4, 8 bits where a slot's LW codes are not whole words: d = 80 has
        // LW = 4): words span lanes unevenly; stage the codes in this warp's region
        const int base = (warp * 2 + VQ_PACK_REGION) * D;
        WARP_SYNC();
        for (int e = 0; e < E; ++e) {
          if (act) {
            cst[base + lane + LW * e] = (uint8_t)VQ_PACK_CODES[e];
          }
        }
        WARP_SYNC();
        for (int w = lane; w < nw; w += 32) {
          uint32_t wv = 0u;
          for (int s = 0; s < kk; ++s) {
            const int jj = w * kk + s;
            if (jj < D) {
              wv |= ((uint32_t)cst[base + jj]) << (VQ_PACK_BITS * s);
            }
          }
          VQ_PACK_OUT[ob + w] = wv;
        }
      }
    }
#undef VQ_PACK_CODES
#undef VQ_PACK_BITS
#undef VQ_PACK_OUT
#undef VQ_PACK_ROW
#undef VQ_PACK_REGION
