// partial_loop.h's sums over each token's P lanes: a reduce-scatter by halving exchanges, an all-gather through sg.
    // -- sum over the token's P lanes: reduce-scatter by halving exchanges (each lane ends with its share
    //    of the U x QB sums: U * QB - 1 shuffles for U * QB >= P instead of U * QB * log2 P), then an
    //    all-gather through threadgroup memory. turboquant_prod's two parts are combined per token first.
    float red[U * QB];
    for (int u = 0; u < U; ++u) {
      for (int r = 0; r < QB; ++r) {
        red[u * QB + r] = (KPARTS == 2 && !is_win) ? part[u][r] + kfac2[u] * part2[u][r % KP2] : part[u][r];
      }
    }
    int base = 0;
    {
      int n = U * QB;
      for (int off = P / 2; off > 0; off >>= 1) {
        if (n >= 2) {
          const int half = n / 2;
          const bool upper = (lane & off) != 0;
          for (int j = 0; j < half; ++j) {
            const float send = upper ? red[j] : red[j + half];
            const float keep = upper ? red[j + half] : red[j];
            red[j] = keep + SHFL_XOR(send, off);
          }
          base += upper ? half : 0;
          n = half;
        } else {
          red[0] += SHFL_XOR(red[0], off);
        }
      }
    }
    {
      constexpr int NFIN = (U * QB >= P) ? (U * QB / P) : 1;
      const int row0 = (warp * TPW + slot) * U * QB;
      for (int j = 0; j < NFIN; ++j) {
        sg[row0 + base + j] = red[j];
      }
      WARP_SYNC();
      for (int u = 0; u < U; ++u) {
        for (int r = 0; r < QB; ++r) {
          part[u][r] = sg[row0 + u * QB + r];
        }
      }
      WARP_SYNC();                         // the next iteration overwrites sg
    }
