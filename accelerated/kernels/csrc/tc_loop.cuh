// Steps 3-4 of the partial kernel on tensor cores (CUDA sm_80+; accelerated/kernels/attention_tc.py says how).

  // 3-4 on tensor cores (attention_tc.py): per warp, chunks of 16 tokens; lane = 4 g + tig; at most 4 query rows
  constexpr int KS = D / 16;              // k-steps of a score tile
  constexpr int KWL = (KB1 * D) / 128;    // key words per lane and token (4 codes per k-step, D / 4 coordinates)
  constexpr bool VWHOLE = VB1 * D >= 256; // a lane group's D / 8 value codes are whole words (else part of one)
  constexpr int VWL = VWHOLE ? (VB1 * D) / 256 : 1;                  // value words per lane group (D / 8 codes)
  constexpr int MT = D / 16;              // m-tiles of the value sums (coordinates in M)
  const int g = lane >> 2;
  const int tig = lane & 3;
  const int part = g >> 2;                // score M row g / value N column g: part 0 (hi) or 1 (lo) of row g % 4
  const int ra = g & 3;
  const bool has_a = ra < QB;
  // scales (powers of two): this lane's query row, the code tables (the value norms' below, as they come)
  float fqa = 1.0f;
  for (int r = 0; r < QB; ++r) {
    float mx = 0.0f;
    for (int c = lane; c < D; c += 32) {
      mx = vq_max(mx, fabsf(sq[r * D + c]));
    }
    for (int o = 16; o > 0; o >>= 1) {
      mx = vq_max(mx, SHFL_XOR(mx, o));
    }
    fqa = (r == ra) ? vq_pow2_for(mx, 11) : fqa;
  }
  float mtk = fabsf(rk1);
  float mtv = fabsf(rv1);
  for (int o = 16; o > 0; o >>= 1) {
    mtk = vq_max(mtk, SHFL_XOR(mtk, o));
    mtv = vq_max(mtv, SHFL_XOR(mtv, o));
  }
  const float ftk = vq_pow2_for(mtk, 11);
  const float ftv = vq_pow2_for(mtv, 11);
  const int nch = is_win ? 0 : (t1 - t0 + 15) / 16;    // the window split: tc_window.h
  const int64_t kso = (int64_t)b * ks0_strides[0] + (int64_t)h * ks0_strides[1];
  const int64_t vso = (int64_t)b * vs0_strides[0] + (int64_t)h * vs0_strides[1];
  // query fragments (A of the scores: M row g; coordinate tig * D / 4 + 4 ks + j, a0 slots j = 0, 1, a2 j = 2, 3;
  // M rows 8-15 are zero)
  uint32_t qa[KS][2];
  for (int ks = 0; ks < KS; ++ks) {
    for (int jp = 0; jp < 2; ++jp) {
      const int c = tig * (D / 4) + 4 * ks + 2 * jp;
      float x0 = has_a ? sq[ra * D + c] * fqa : 0.0f;
      float x1 = has_a ? sq[ra * D + c + 1] * fqa : 0.0f;
      if (part == 1) {
        x0 -= vq_hround(x0);
        x1 -= vq_hround(x1);
      }
      qa[ks][jp] = vq_h2(x0, x1);
    }
  }
  // code tables: entry lane % 16 (4-bit codes), scaled, its float16 hi and lo parts in one word
  const float tk = rk1 * ftk;
  const float tv = rv1 * ftv;
  const uint32_t tabk = vq_h2(tk, tk - vq_hround(tk));
  const uint32_t tabv = vq_h2(tv, tv - vq_hround(tv));
  const float uka = (1.0f / fqa) * (1.0f / ftk);     // exact: powers of two
  const int qpa = qpos[has_a ? ra : 0];
  float m_a = NEG_INF;
  float l_a = 0.0f;
  float fv = 0.0f;                        // P' = p * value norm * fv: set by the first chunk, lowered when a chunk's
                                          // norms would take P' past 2^11 (a power of two: O is scaled with it)
  float o[MT][4];
  for (int mt = 0; mt < MT; ++mt) {
    for (int i = 0; i < 4; ++i) {
      o[mt][i] = 0.0f;
    }
  }
  const DEVICE uint32_t* kbase = kc1 + (int64_t)b * kc1_strides[0] + (int64_t)h * kc1_strides[1] + KWL * tig;
  // a lane group's D / 8 value codes start at bit g * D / 8 * VB1 of the row: whole words at 4 bits, part of
  // one below 32 bits a group (vsh: the group's first bit in its word)
  const int vsh = VWHOLE ? 0 : (g * (D / 8) * VB1) % 32;
  const DEVICE uint32_t* vbase = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1]
                                 + (VWHOLE ? VWL * g : (g * (D / 8) * VB1) / 32);
  // rabitq (MK / MV = 2): a token's factor is g = (n s_d) / ip (0 where ip = 0), its codes' table the signs
  const int64_t kso1 = (MK == 2) ? (int64_t)b * ks1_strides[0] + (int64_t)h * ks1_strides[1] : 0;
  const int64_t vso1 = (MV == 2) ? (int64_t)b * vs1_strides[0] + (int64_t)h * vs1_strides[1] : 0;
  // one chunk's loads: key words of tokens tb + 8 nt + g; value words, key and value norms of the tokens of
  // slot x: tb + 8 (x / 2) + 2 tig + x % 2 (a score's C slot, a probability's B slot and a value's A slot)
#define TC_LOAD(J, KWD, VWD, KN, VN) { \
    const int tb_ = t0 + 16 * (J); \
    for (int nt = 0; nt < 2; ++nt) { \
      const int t_ = tb_ + 8 * nt + g; \
      vq_words<KWL>(kbase + (int64_t)(t_ < t1 ? t_ : t0) * kc1_strides[2], KWD[nt]); \
    } \
    for (int x = 0; x < 4; ++x) { \
      const int t_ = tb_ + 8 * (x >> 1) + 2 * tig + (x & 1); \
      const int64_t tt_ = (t_ < t1) ? t_ : t0; \
      vq_words<VWL>(vbase + tt_ * vc1_strides[2], VWD[x]); \
      KN[x] = ks0[kso + tt_ * ks0_strides[2]]; \
      VN[x] = vs0[vso + tt_ * vs0_strides[2]]; \
      if (MK == 2) { \
        const float ip_ = ks1[kso1 + tt_ * ks1_strides[2]]; \
        KN[x] = (ip_ > 0.0f) ? vq_fdiv(KN[x] * f_k[0], ip_) : 0.0f; \
      } \
      if (MV == 2) { \
        const float ip_ = vs1[vso1 + tt_ * vs1_strides[2]]; \
        VN[x] = (ip_ > 0.0f) ? vq_fdiv(VN[x] * f_k[0], ip_) : 0.0f; \
      } \
    } }
  // PF > 0: the loads of the next PF chunks in flight (register sets, shifted down once per chunk); PF = 0:
  // a chunk's loads at its start
  constexpr int PFD = (PF > 0) ? PF : 1;
  uint32_t kwc[2][KWL], vwc[4][VWL], kwp[PFD][2][KWL], vwp[PFD][4][VWL];
  float knc[4], vnc[4], knp[PFD][4], vnp[PFD][4];
  for (int q = 0; q < PF; ++q) {
    if (warp + q * NW < nch) {
      TC_LOAD(warp + q * NW, kwp[q], vwp[q], knp[q], vnp[q])
    }
  }
  for (int j = warp; j < nch; j += NW) {
    if (PF > 0) {
      for (int nt = 0; nt < 2; ++nt) {
        for (int i = 0; i < KWL; ++i) {
          kwc[nt][i] = kwp[0][nt][i];
        }
      }
      for (int x = 0; x < 4; ++x) {
        for (int i = 0; i < VWL; ++i) {
          vwc[x][i] = vwp[0][x][i];
        }
        knc[x] = knp[0][x];
        vnc[x] = vnp[0][x];
      }
      for (int q = 0; q + 1 < PF; ++q) {
        for (int nt = 0; nt < 2; ++nt) {
          for (int i = 0; i < KWL; ++i) {
            kwp[q][nt][i] = kwp[q + 1][nt][i];
          }
        }
        for (int x = 0; x < 4; ++x) {
          for (int i = 0; i < VWL; ++i) {
            vwp[q][x][i] = vwp[q + 1][x][i];
          }
          knp[q][x] = knp[q + 1][x];
          vnp[q][x] = vnp[q + 1][x];
        }
      }
      if (j + PF * NW < nch) {
        TC_LOAD(j + PF * NW, kwp[PFD - 1], vwp[PFD - 1], knp[PFD - 1], vnp[PFD - 1])
      }
    } else {
      TC_LOAD(j, kwc, vwc, knc, vnc)
    }
    const int tb = t0 + 16 * j;
    // -- scores S = Q K^T: two n-tiles of 8 tokens, each k-step twice (the keys' hi parts, then their lo parts)
    float sc[2][4];
    for (int nt = 0; nt < 2; ++nt) {
      for (int i = 0; i < 4; ++i) {
        sc[nt][i] = 0.0f;
      }
      for (int ks = 0; ks < KS; ++ks) {
        const uint32_t w = kwc[nt][(4 * KB1 * ks) / 32] >> ((4 * KB1 * ks) % 32);
        const uint32_t e0 = SHFL_IDX(tabk, w);
        const uint32_t e1 = SHFL_IDX(tabk, w >> KB1);
        const uint32_t e2 = SHFL_IDX(tabk, w >> (2 * KB1));
        const uint32_t e3 = SHFL_IDX(tabk, w >> (3 * KB1));
        vq_mma(sc[nt], qa[ks][0], 0u, qa[ks][1], 0u, vq_perm(e0, e1, 0x5410u), vq_perm(e2, e3, 0x5410u));
        vq_mma(sc[nt], qa[ks][0], 0u, qa[ks][1], 0u, vq_perm(e0, e1, 0x7632u), vq_perm(e2, e3, 0x7632u));
      }
    }
    // -- a row's two parts (lanes g, g ^ 4) summed, times norm and the scales' inverse; masked: -inf
    float xa[4];
    for (int x = 0; x < 4; ++x) {
      const int t = tb + 8 * (x >> 1) + 2 * tig + (x & 1);
      const float ya = sc[x >> 1][x & 1];
      const float za = ya + SHFL_XOR(ya, 16);
      xa[x] = (t < t1 && (!CAUSAL || t <= qpa)) ? za * knc[x] * uka : NEG_INF;
    }
    // -- online softmax per row over the chunk (a row's 16 tokens lie in its 4 lanes tig)
    float pa[4];
    float mb = vq_max(vq_max(xa[0], xa[1]), vq_max(xa[2], xa[3]));
    mb = vq_max(mb, SHFL_XOR(mb, 1));
    mb = vq_max(mb, SHFL_XOR(mb, 2));
    const float mn = vq_max(m_a, mb);
    float ls = 0.0f;
    for (int x = 0; x < 4; ++x) {
      pa[x] = (mn == NEG_INF) ? 0.0f : vq_exp2(xa[x] - mn);
      ls += pa[x];
    }
    const float alpha = (mn == NEG_INF) ? 1.0f : vq_exp2(m_a - mn);
    l_a = l_a * alpha + ls;
    m_a = mn;
    // the chunk's largest value norm (its 16 tokens are the 4 slots of lanes tig, the same for every g)
    float cv = vq_max(vq_max(fabsf(vnc[0]), fabsf(vnc[1])), vq_max(fabsf(vnc[2]), fabsf(vnc[3])));
    cv = vq_max(cv, SHFL_XOR(cv, 1));
    cv = vq_max(cv, SHFL_XOR(cv, 2));
    float rs = 1.0f;                      // warp-uniform: O's rescale for a lower fv
    if (fv == 0.0f || cv * fv >= 2048.0f) {
      const float fn = vq_pow2_for(cv, 11);
      rs = (fv == 0.0f) ? 1.0f : fn / fv;
      fv = fn;
    }
    if (VQ_ANY(alpha != 1.0f) || rs != 1.0f) {
      // O^T column n = 2 tig + e holds row n % 4: its alpha is lane 4 (n % 4)'s
      const float al0 = SHFL_IDX(alpha, 4 * ((2 * tig) & 3)) * rs;
      const float al1 = SHFL_IDX(alpha, 4 * ((2 * tig + 1) & 3)) * rs;
      for (int mt = 0; mt < MT; ++mt) {
        o[mt][0] *= al0;
        o[mt][1] *= al1;
        o[mt][2] *= al0;
        o[mt][3] *= al1;
      }
    }
    // -- P' = p * value norm * fv, its part of the row as the B operand (k: tokens 2 tig, 2 tig + 1 / + 8, n: g)
    float ua[4];
    for (int x = 0; x < 4; ++x) {
      ua[x] = pa[x] * vnc[x] * fv;
      if (part == 1) {
        ua[x] -= vq_hround(ua[x]);
      }
    }
    const uint32_t p0 = vq_h2(ua[0], ua[1]);
    const uint32_t p1 = vq_h2(ua[2], ua[3]);
    // -- value sums O^T += V^T P'^T: m-tile mt has coordinates g * D / 8 + mt (rows g) and + D / 16 (rows g + 8)
    //    of tokens 2 tig, 2 tig + 1 (a0, a1) and 2 tig + 8, 2 tig + 9 (a2, a3)
    // below 32 bits a group (VWL = 1) the group's codes lie in its one word: index 0 written as a constant, since
    // an index through the run-time vsh put vwc in local memory (60 loads per chunk for rabitq, sm_90)
    for (int mt = 0; mt < MT; ++mt) {
      const int wa = VWHOLE ? (VB1 * mt) / 32 : 0;
      const int sa = VWHOLE ? (VB1 * mt) % 32 : vsh + VB1 * mt;
      const int wb = VWHOLE ? (VB1 * (D / 16 + mt)) / 32 : 0;
      const int sb = VWHOLE ? (VB1 * (D / 16 + mt)) % 32 : vsh + VB1 * (D / 16 + mt);
      const uint32_t e0 = SHFL_IDX(tabv, vwc[0][wa] >> sa);
      const uint32_t e1 = SHFL_IDX(tabv, vwc[1][wa] >> sa);
      const uint32_t e2 = SHFL_IDX(tabv, vwc[2][wa] >> sa);
      const uint32_t e3 = SHFL_IDX(tabv, vwc[3][wa] >> sa);
      const uint32_t f0 = SHFL_IDX(tabv, vwc[0][wb] >> sb);
      const uint32_t f1 = SHFL_IDX(tabv, vwc[1][wb] >> sb);
      const uint32_t f2 = SHFL_IDX(tabv, vwc[2][wb] >> sb);
      const uint32_t f3 = SHFL_IDX(tabv, vwc[3][wb] >> sb);
      vq_mma(o[mt], vq_perm(e0, e1, 0x5410u), vq_perm(f0, f1, 0x5410u), vq_perm(e2, e3, 0x5410u),
             vq_perm(f2, f3, 0x5410u), p0, p1);
      vq_mma(o[mt], vq_perm(e0, e1, 0x7632u), vq_perm(f0, f1, 0x7632u), vq_perm(e2, e3, 0x7632u),
             vq_perm(f2, f3, 0x7632u), p0, p1);
    }
  }
#undef TC_LOAD
  SHARED(float, swo, NW * QB * D);
  SHARED(float, swm, NW * 4);
  SHARED(float, swl, NW * 4);
  SHARED(float, sacc, QB * D);
  SHARED(float, sml, 2 * QB);
  if (is_win) {
#include "tc_window.h"
  } else {
  // -- this warp's state: l over a row's 4 lanes tig; O^T's two parts (columns n, n + 4: lanes tig, tig ^ 2)
  //    summed and scaled back; then the warps merged through threadgroup memory
  l_a += SHFL_XOR(l_a, 1);
  l_a += SHFL_XOR(l_a, 2);
  const float uv = (fv == 0.0f) ? 0.0f : (1.0f / fv) * (1.0f / ftv);   // fv == 0: no chunk, O = 0
  for (int mt = 0; mt < MT; ++mt) {
    for (int i = 0; i < 4; ++i) {
      o[mt][i] = (o[mt][i] + SHFL_XOR(o[mt][i], 2)) * uv;
    }
  }
  if (tig == 0 && g < 4) {
    swm[warp * 4 + g] = m_a;
    swl[warp * 4 + g] = l_a;
  }
  BARRIER();
  if (tig < 2) {
    for (int e = 0; e < 2; ++e) {
      const int r = 2 * tig + e;
      if (r < QB) {
        float mx = NEG_INF;
        for (int w = 0; w < NW; ++w) {
          mx = vq_max(mx, swm[w * 4 + r]);
        }
        const float mw = swm[warp * 4 + r];
        const float f = (mw == NEG_INF) ? 0.0f : vq_exp2(mw - mx);
        for (int mt = 0; mt < MT; ++mt) {
          swo[(warp * QB + r) * D + (D / 8) * g + mt] = o[mt][e] * f;
          swo[(warp * QB + r) * D + (D / 8) * g + D / 16 + mt] = o[mt][2 + e] * f;
        }
      }
    }
  }
  }
  BARRIER();
  VQ_COLD
  for (int i = tid; i < QB * D; i += NT) {
    float y = 0.0f;
    for (int w = 0; w < NW; ++w) {
      y += swo[w * QB * D + i];
    }
    sacc[i] = y;
  }
  for (int r = tid; r < QB; r += NT) {
    float mx = NEG_INF;
    for (int w = 0; w < NW; ++w) {
      mx = vq_max(mx, swm[w * 4 + r]);
    }
    float y = 0.0f;
    for (int w = 0; w < NW; ++w) {
      const float mw = swm[w * 4 + r];
      y += (mw == NEG_INF) ? 0.0f : swl[w * 4 + r] * vq_exp2(mw - mx);
    }
    sml[2 * r] = mx;
    sml[2 * r + 1] = y;
  }
  BARRIER();
