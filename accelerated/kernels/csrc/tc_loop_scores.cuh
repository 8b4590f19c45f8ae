// tc_loop.cuh's scores of one chunk: S = Q K^T on tensor cores, a row's two parts summed and scaled, masked (xa).
    const int tb = t0 + 16 * j;
    // -- scores S = Q K^T: two n-tiles of 8 tokens, each k-step twice (the keys' hi parts, then their lo parts)
    float sc[2][4];
#include VQ_TC_UNROLL_NT
    for (int nt = 0; nt < 2; ++nt) {
      for (int i = 0; i < 4; ++i) {
        sc[nt][i] = 0.0f;
      }
      for (int ks = 0; ks < KS; ++ks) {
#include VQ_TC_KEYS
        vq_mma(sc[nt], qa[ks][0], 0u, qa[ks][1], 0u, vq_perm(e0, e1, 0x5410u), vq_perm(e2, e3, 0x5410u));
        vq_mma(sc[nt], qa[ks][0], 0u, qa[ks][1], 0u, vq_perm(e0, e1, 0x7632u), vq_perm(e2, e3, 0x7632u));
      }
#include VQ_TC_SCORES2
    }
    // -- a row's two parts (lanes g, g ^ 4) summed, times norm and the scales' inverse; masked: -inf
    float xa[4];
    for (int x = 0; x < 4; ++x) {
      const int t = tb + 8 * (x >> 1) + 2 * tig + (x & 1);
      const float ya = sc[x >> 1][x & 1];
      const float za = ya + SHFL_XOR(ya, 16);
      xa[x] = (t < t1 && (!CAUSAL || t <= qpa)) ? za * knc[x] * uka : NEG_INF;
    }
#include VQ_TC_XA2
