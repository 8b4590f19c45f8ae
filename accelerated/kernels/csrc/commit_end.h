// The commit kernel's end: each check's hit, ORed over the block column's threads, into the token (row which -
// VQ_NWRITES, column col); with no checks, column col of row 0 is zero.

  hit[tid] = mine;
  BARRIER();
  if (tid == 0) {
    if (which >= VQ_NWRITES) {
      uint32_t any = 0u;
      for (int k = 0; k < VQ_NT; ++k) {
        any |= hit[k];
      }
      out[(which - VQ_NWRITES) * ncol + col] = any;
    } else if (VQ_NCHECKS == 0 && which == 0) {
      out[col] = 0u;
    }
  }
