// VQ_Q_OUT = number of boundaries strictly below f_Q_VAL (the sorted table f_Q_TABLE of 2^VQ_Q_BITS - 1 entries
// from index VQ_Q_BASE).

      uint32_t VQ_Q_OUT = 0u;
      {
        int qa = VQ_Q_BASE;                          // base + the count so far
        int s = 1 << (VQ_Q_BITS - 1);
        for (int st = 0; st < 4; ++st) {        // nbits <= 4: a fixed trip count, unrolled
          if (s > 0 && f_Q_VAL > f_Q_TABLE[qa + (s - 1)]) {
            qa += s;
          }
          s >>= 1;
        }
        VQ_Q_OUT = (uint32_t)(qa - VQ_Q_BASE);
      }
#undef f_Q_VAL
#undef f_Q_TABLE
#undef VQ_Q_BITS
#undef VQ_Q_OUT
#undef VQ_Q_BASE
