// VQ_UNPACK_OUT[e] = code j = lane + LW*e of row VQ_UNPACK_ROW of VQ_UNPACK_WORDS at VQ_UNPACK_BITS bits:
// (word[j div k] >> (b * (j mod k))) & (2^b - 1).

    uint32_t VQ_UNPACK_OUT[E];
    {
      const int kk = 32 / VQ_UNPACK_BITS;
      const int nw = (D + kk - 1) / kk;
      const int64_t ib = (int64_t)(VQ_UNPACK_ROW) * nw;
      const int qw = LW / kk;
      const int rw = LW % kk;
      int wi = lane / kk;
      int ws = lane % kk;
      for (int e = 0; e < E; ++e) {
        VQ_UNPACK_OUT[e] = act ? (VQ_UNPACK_WORDS[ib + wi] >> (VQ_UNPACK_BITS * ws)) & ((1u << VQ_UNPACK_BITS) - 1u) : 0u;
        wi += qw;
        ws += rw;
        if (ws >= kk) {
          ws -= kk;
          wi += 1;
        }
      }
    }
#undef VQ_UNPACK_WORDS
#undef VQ_UNPACK_BITS
#undef VQ_UNPACK_ROW
#undef VQ_UNPACK_OUT
