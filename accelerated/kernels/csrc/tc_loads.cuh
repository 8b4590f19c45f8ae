// A tensor-core loop's loads of one chunk: the prefetched register sets taken and shifted down (TC_PF > 0), or loaded
// now. The loop's macros: TC_PF its prefetch depth; TC_KSIDES(F, i) / TC_XSIDES(F, i): F(n, i) for each register a
// key slot nt / value slot x holds beside its words (n##c the chunk's, n##p the prefetched sets); TC_LOAD_NEXT its
// TC_LOAD of chunk j + TC_PF * NW into set PFD - 1, TC_LOAD_NOW that of chunk j into the chunk's registers.
#define TC_TAKE(n, i) n##c[i] = n##p[0][i];
#define TC_SHIFT(n, i) n##p[q][i] = n##p[q + 1][i];
    if (TC_PF > 0) {
      for (int nt = 0; nt < 2; ++nt) {
        for (int i = 0; i < KWL; ++i) {
          kwc[nt][i] = kwp[0][nt][i];
        }
        TC_KSIDES(TC_TAKE, nt)
      }
      for (int x = 0; x < 4; ++x) {
        for (int i = 0; i < VWL; ++i) {
          vwc[x][i] = vwp[0][x][i];
        }
        TC_XSIDES(TC_TAKE, x)
      }
      for (int q = 0; q + 1 < TC_PF; ++q) {
        for (int nt = 0; nt < 2; ++nt) {
          for (int i = 0; i < KWL; ++i) {
            kwp[q][nt][i] = kwp[q + 1][nt][i];
          }
          TC_KSIDES(TC_SHIFT, nt)
        }
        for (int x = 0; x < 4; ++x) {
          for (int i = 0; i < VWL; ++i) {
            vwp[q][x][i] = vwp[q + 1][x][i];
          }
          TC_XSIDES(TC_SHIFT, x)
        }
      }
#include VQ_TC_TAKE2
      if (j + TC_PF * NW < nch) {
        TC_LOAD_NEXT
      }
    } else {
      TC_LOAD_NOW
    }
#undef TC_TAKE
#undef TC_SHIFT
#undef TC_PF
#undef TC_KSIDES
#undef TC_XSIDES
#undef TC_LOAD_NEXT
#undef TC_LOAD_NOW
