// Steps 3-5 of the partial kernel's scalar loop: the online softmax over a split's tokens, the merge of token
// slots and warps (tc_loop.cuh is the tensor-core alternative).
  // 3. online softmax over this split's tokens, U tokens per lane per iteration (independent loads and
  //    reductions in flight), one rescale per iteration
  constexpr int TPB = TPI * U;           // U: tokens per lane per iteration (template)
  constexpr int KP2 = (KPARTS == 2) ? QB : 1;     // sizes of arrays that only turboquant_prod uses
  constexpr int VP2 = (VPARTS == 2) ? NC : 1;
  float m[QB];
  float l[QB];
  float acc[QB][NC];
  float acc2[VPARTS == 2 ? QB : 1][VP2];
  for (int r = 0; r < QB; ++r) {
    m[r] = NEG_INF;
    l[r] = 0.0f;
    for (int c = 0; c < NC; ++c) {
      acc[r][c] = 0.0f;
      acc2[r % (VPARTS == 2 ? QB : 1)][c % VP2] = 0.0f;
    }
  }
  SHARED(float, sg, NW * TPW * U * QB);   // per token slot: the all-gather of its U x QB scores
  // the 8 values of chunk ch of a row (or of its word, loaded early): codes, then VQ_LOOKUP
#define VQ_CHUNK(B, row, ch, reg, out) { uint32_t c8_[8]; vq_codes<B>(row, ch, c8_);     for (int j_ = 0; j_ < 8; ++j_) { out[j_] = VQ_LOOKUP(reg, c8_[j_]); } }
#define VQ_CHUNK_W(B, w, ch, reg, out) { uint32_t c8_[8]; vq_codes_w<B>(w, ch, c8_);     for (int j_ = 0; j_ < 8; ++j_) { out[j_] = VQ_LOOKUP(reg, c8_[j_]); } }
  // Word-aligned code streams of the rotation family (1, 2 or 4 bits) are loaded ahead of their use: the
  // words and factors of one iteration's U tokens for keys (KPRE) and values (VPRE) at once, and with PF the
  // next iteration's while this one is scored (two register sets). Other methods load as they decode.
  constexpr bool KPRE = MK <= 2 && (KB1 == 1 || KB1 == 2 || KB1 == 4) && (MK != 1 || KB2 == 1 || KB2 == 2 || KB2 == 4);
  constexpr bool VPRE = MV <= 3 && (VB1 == 1 || VB1 == 2 || VB1 == 4) && (VB2 == 1 || VB2 == 2 || VB2 == 4);
  constexpr int KU = KPRE ? U : 1;
  constexpr int KN = KPRE ? NCH : 1;
  constexpr int VU = VPRE ? U : 1;
  constexpr int VN = VPRE ? NCH : 1;
#define VQ_LOAD(IT, K1, K2, KS0, KS1, V1, V2, VS0, VS1)   for (int u = 0; u < U; ++u) {     const int t_ = t0 + (IT) * TPB + u * TPI + warp * TPW + slot;     const int64_t tt_ = (t_ < t1) ? t_ : t0;     const int64_t tk_ = VQ_KROW(tt_);     const int64_t tv_ = VQ_VROW(tt_);     if (KPRE) {       const DEVICE uint32_t* r1_ = kc1 + (int64_t)b * kc1_strides[0] + (int64_t)h * kc1_strides[1] + tk_ * kc1_strides[2];       const DEVICE uint32_t* r2_ = kc2 + (int64_t)b * kc2_strides[0] + (int64_t)h * kc2_strides[1] + tk_ * kc2_strides[2];       for (int k = 0; k < NCH; ++k) {         K1[u % KU][k % KN] = vq_chunk_word<KB1>(r1_, lp + k * P);         if (MK == 1) { K2[u % KU][k % KN] = vq_chunk_word<KB2>(r2_, lp + k * P); }       }       KS0[u % KU] = ks0[(int64_t)b * ks0_strides[0] + (int64_t)h * ks0_strides[1] + tk_ * ks0_strides[2]];       if (MK == 2) { KS1[u % KU] = ks1[(int64_t)b * ks1_strides[0] + (int64_t)h * ks1_strides[1] + tk_ * ks1_strides[2]]; }     }     if (VPRE) {       const DEVICE uint32_t* r1_ = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1] + tv_ * vc1_strides[2];       const DEVICE uint32_t* r2_ = vc2 + (int64_t)b * vc2_strides[0] + (int64_t)h * vc2_strides[1] + tv_ * vc2_strides[2];       for (int k = 0; k < NCH; ++k) {         V1[u % VU][k % VN] = vq_chunk_word<VB1>(r1_, lp + k * P);         if (MV == 1 || MV == 3) { V2[u % VU][k % VN] = vq_chunk_word<VB2>(r2_, lp + k * P); }       }       VS0[u % VU] = vs0[(int64_t)b * vs0_strides[0] + (int64_t)h * vs0_strides[1] + tv_ * vs0_strides[2]];       if (MV == 2 || MV == 3) { VS1[u % VU] = vs1[(int64_t)b * vs1_strides[0] + (int64_t)h * vs1_strides[1] + tv_ * vs1_strides[2]]; }     }   }
#include "partial_mixed.h"
  // this iteration's loads (p*) and, with PF, the next one's (n*)
  uint32_t pk1[KU][KN], pk2[KU][KN], pv1[VU][VN], pv2[VU][VN];
  float pks0[KU], pks1[KU], pvs0[VU], pvs1[VU];
  uint32_t nk1[PF ? KU : 1][PF ? KN : 1], nk2[PF ? KU : 1][PF ? KN : 1];
  uint32_t nv1[PF ? VU : 1][PF ? VN : 1], nv2[PF ? VU : 1][PF ? VN : 1];
  float nks0[PF ? KU : 1], nks1[PF ? KU : 1], nvs0[PF ? VU : 1], nvs1[PF ? VU : 1];
  for (int u = 0; u < KU; ++u) {
    pks1[u] = 0.0f;
    nks1[u % (PF ? KU : 1)] = 0.0f;
  }
  for (int u = 0; u < VU; ++u) {
    pvs1[u] = 0.0f;
    nvs1[u % (PF ? VU : 1)] = 0.0f;
  }
  const int n_it = (t1 - t0 + TPB - 1) / TPB;
  if (PF && (KPRE || VPRE) && !is_win && n_it > 0) {
    VQ_LOAD(0, nk1, nk2, nks0, nks1, nv1, nv2, nvs0, nvs1)
  }
  for (int it = 0; it < n_it; ++it) {
    int tu[U];
    bool ok[U];
    for (int u = 0; u < U; ++u) {
      const int t = t0 + it * TPB + u * TPI + warp * TPW + slot;
      ok[u] = t < t1;
      tu[u] = ok[u] ? t : t0;             // a readable token for lanes past the end (result unused)
    }
    if ((KPRE || VPRE) && !is_win) {
      if (PF) {
        for (int u = 0; u < U; ++u) {
          for (int k = 0; k < NCH; ++k) {
            pk1[u % KU][k % KN] = nk1[u % KU][k % KN];
            pk2[u % KU][k % KN] = nk2[u % KU][k % KN];
            pv1[u % VU][k % VN] = nv1[u % VU][k % VN];
            pv2[u % VU][k % VN] = nv2[u % VU][k % VN];
          }
          pks0[u % KU] = nks0[u % KU];
          pks1[u % KU] = nks1[u % KU];
          pvs0[u % VU] = nvs0[u % VU];
          pvs1[u % VU] = nvs1[u % VU];
        }
        if (it + 1 < n_it) {
          VQ_LOAD(it + 1, nk1, nk2, nks0, nks1, nv1, nv2, nvs0, nvs1)
        }
      } else {
        VQ_LOAD(it, pk1, pk2, pks0, pks1, pv1, pv2, pvs0, pvs1)
      }
    }
    // -- keys: partial dot products of this lane's coordinates, and each token's factors
    float part[U][QB];
    float part2[U][KP2];
    float kfac[U];
    float kfac2[U];
    for (int u = 0; u < U; ++u) {
      const int tt = tu[u];
      float kv[NC];
      float kv2[KPARTS == 2 ? NC : 1];
      kfac[u] = 1.0f;
      kfac2[u] = 0.0f;
#if VQ_MIXED
      const bool kex = is_win || tt >= QK;        // exact: the window split, or split S - 1 past the keys' records
      const int kwr = is_win ? tt + KWO : tt - QK;    // its row of the keys' window
#else
      const bool kex = is_win;
      const int kwr = tt;
#endif
      if (!is_win) {      // (every lane of an encoded split: the code lookups shuffle)
        if (KPRE) {
          kfac[u] = pks0[u % KU];
          if (MK == 2) {
            const float a1 = pks1[u % KU];
            kfac[u] = (a1 > 0.0f) ? (kfac[u] * f_k[0]) / a1 : 0.0f;   // g = (n s_d) / ip
          }
          for (int k = 0; k < NCH; ++k) {
            const int ch = lp + k * P;
            float v8[8];
            VQ_CHUNK_W(KB1, pk1[u % KU][k % KN], ch, rk1, v8);
            if (MK == 1) {
              float w8[8];
              VQ_CHUNK_W(KB2, pk2[u % KU][k % KN], ch, rk2, w8);
              for (int j = 0; j < 8; ++j) {
                v8[j] += w8[j];
              }
            }
            for (int j = 0; j < 8; ++j) {
              kv[k * 8 + j] = v8[j];
            }
          }
        } else {
          const int ttk = VQ_KROW(tt);
          const DEVICE uint32_t* row1 = kc1 + (int64_t)b * kc1_strides[0] + (int64_t)h * kc1_strides[1]
                                        + (int64_t)ttk * kc1_strides[2];
          const DEVICE uint32_t* row2 = kc2 + (int64_t)b * kc2_strides[0] + (int64_t)h * kc2_strides[1]
                                        + (int64_t)ttk * kc2_strides[2];
          if (MK <= 3) {
            kfac[u] = ks0[(int64_t)b * ks0_strides[0] + (int64_t)h * ks0_strides[1] + (int64_t)ttk * ks0_strides[2]];
          }
          if (MK == 2 || MK == 3) {
            const float a1 = ks1[(int64_t)b * ks1_strides[0] + (int64_t)h * ks1_strides[1] + (int64_t)ttk * ks1_strides[2]];
            if (MK == 2) {
              kfac[u] = (a1 > 0.0f) ? (kfac[u] * f_k[0]) / a1 : 0.0f;   // g = (n s_d) / ip
            } else {
              kfac2[u] = a1 * f_k[1];                                  // gamma A_d
            }
          }
          for (int k = 0; k < NCH; ++k) {
            const int ch = lp + k * P;
            float v8[8];
            if (MK == 0 || MK == 3) {
              VQ_CHUNK(KB1, row1, ch, rk1, v8);
            }
            if (MK == 1) {
              float w8[8];
              VQ_CHUNK(KB1, row1, ch, rk1, v8);
              VQ_CHUNK(KB2, row2, ch, rk2, w8);
              for (int j = 0; j < 8; ++j) {
                v8[j] += w8[j];
              }
            }
            if (MK == 2) {
              VQ_CHUNK(1, row1, ch, rk1, v8);
            }
            if (MK == 3) {
              float w8[8];
              VQ_CHUNK(1, row2, ch, rk2, w8);
              for (int j = 0; j < 8; ++j) {
                kv2[(k * 8 + j) % (KPARTS == 2 ? NC : 1)] = w8[j];
              }
            }
            if (MK == 4 || MK == 5) {
              for (int j = 0; j < 8; ++j) {
                const int c = ch * 8 + j;
                const int64_t g = (int64_t)b * kgs_strides[0] + (int64_t)h * kgs_strides[1]
                                  + (int64_t)(MK == 4 ? ttk / KG : ttk) * kgs_strides[2]
                                  + (int64_t)(MK == 4 ? c : c / KG) * kgs_strides[3];
                const float x = (float)vq_code<KB1>(row1, c) * static_cast<float>(kgs[g]);
                v8[j] = (MK == 4) ? x + static_cast<float>(kgz[g])
                                  : vq_round_to(kgs[0], vq_round_to(kgs[0], x) + static_cast<float>(kgz[g]));
              }
            }
            for (int j = 0; j < 8; ++j) {
              kv[k * 8 + j] = v8[j];
            }
          }
        }
      }
      if (kex) {
#if VQ_MIXED
        kfac[u] = 1.0f;
        kfac2[u] = 0.0f;
#endif
        // APPEND with a window: this launch's append writes the window's last VQ_TNEW rows (split S - 1, as
        // attention_append.h runs it), so this split reads those tokens from the chunk kx itself
        const int vq_nw = kwr - (RK - VQ_TNEW);
#if VQ_MIXED
        for (int c = 0; c < NC; ++c) {
          kv2[c % (KPARTS == 2 ? NC : 1)] = 0.0f;
        }
#endif
        if (APPEND && HASWIN && vq_nw >= 0) {
          const int64_t nbase = (int64_t)b * kx_strides[0] + (int64_t)h * kx_strides[1] + (int64_t)vq_nw * kx_strides[2];
          for (int k = 0; k < NCH; ++k) {
            for (int j = 0; j < 8; ++j) {
              kv[k * 8 + j] = static_cast<float>(kx[nbase + (int64_t)((lp + k * P) * 8 + j) * kx_strides[3]]);
            }
          }
        } else {
          const int64_t base = (int64_t)b * kw_strides[0] + (int64_t)h * kw_strides[1] + (int64_t)kwr * kw_strides[2];
          for (int k = 0; k < NCH; ++k) {
            for (int j = 0; j < 8; ++j) {
              kv[k * 8 + j] = static_cast<float>(kw[base + (int64_t)((lp + k * P) * 8 + j) * kw_strides[3]]);
            }
          }
        }
      }
#if VQ_MIXED
      if (KROT && s == S - 1) {     // (every lane of the block: the butterflies shuffle)
        float kr_[NC];
        for (int c = 0; c < NC; ++c) {
          kr_[c] = kv[c];
        }
        VQ_ROTATE(kr_, f_ksig)
        for (int c = 0; c < NC; ++c) {
          kv[c] = kex ? kr_[c] : kv[c];
        }
      }
#endif
      for (int r = 0; r < QB; ++r) {
        float a = 0.0f;
        float a2 = 0.0f;
        for (int c = 0; c < NC; ++c) {
          a += qr[r][c] * kv[c];
          if (KPARTS == 2) {
            a2 += qr2[r % KP2][c % (KPARTS == 2 ? NC : 1)] * kv2[c % (KPARTS == 2 ? NC : 1)];
          }
        }
        part[u][r] = a;
        part2[u][r % KP2] = a2;
      }
    }
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
    // -- scores (masked: -inf), then the running max, sum and one rescale per query row
    float w[U][QB];
    for (int r = 0; r < QB; ++r) {
      float mb = NEG_INF;
      for (int u = 0; u < U; ++u) {
        // (no causal mask in a decode step: compiled out; rows past nq have zero queries and are never written)
        const bool use = ok[u] && (!CAUSAL || (is_win ? WQ + tu[u] : tu[u]) <= qpos[r]);
        const float x = kfac[u] * part[u][r];
        w[u][r] = use ? x : NEG_INF;
        mb = vq_max(mb, w[u][r]);
      }
      const float mn = vq_max(m[r], mb);
      float alpha = 1.0f;
      if (mn != NEG_INF) {
        alpha = vq_exp2(m[r] - mn);                   // m = -inf (nothing seen yet): exp2(-inf) = 0
        float ls = 0.0f;
        for (int u = 0; u < U; ++u) {
          w[u][r] = vq_exp2(w[u][r] - mn);            // masked: exp2(-inf) = 0
          ls += w[u][r];
        }
        l[r] = l[r] * alpha + ls;
        m[r] = mn;
      } else {
        for (int u = 0; u < U; ++u) {
          w[u][r] = 0.0f;
        }
      }
      for (int c = 0; c < NC; ++c) {
        acc[r][c] *= alpha;
        acc2[r % (VPARTS == 2 ? QB : 1)][c % VP2] *= alpha;
      }
    }
    // -- values: this lane's coordinates (rotated domain for the rotation family), weighted. Unrolled on CUDA: left
    //    rolled (turboquant_prod's long body), tu[u] and w[u][r] went to local memory (an 80-byte stack frame)
    VQ_UNROLL
    for (int u = 0; u < U; ++u) {
      const int tt = tu[u];
      float vv[NC];
      float vv2[VP2];
      float vfac = 1.0f;
      float vfac2 = 0.0f;
#if VQ_MIXED
      const bool vex = is_win || tt >= QV;        // exact: the window split, or split S - 1 past the values' records
      const int vwr = is_win ? tt + VWO : tt - QV;
#else
      const bool vex = is_win;
      const int vwr = tt;
#endif
      if (!is_win) {      // (every lane of an encoded split: the code lookups shuffle)
        if (VPRE) {
          vfac = pvs0[u % VU];
          if (MV == 2) {
            const float a1 = pvs1[u % VU];
            vfac = (a1 > 0.0f) ? (vfac * f_k[0]) / a1 : 0.0f;
          }
          if (MV == 3) {
            vfac2 = vfac * (pvs1[u % VU] * f_k[1]);
          }
          for (int k = 0; k < NCH; ++k) {
            const int ch = lp + k * P;
            float v8[8];
            VQ_CHUNK_W(VB1, pv1[u % VU][k % VN], ch, rv1, v8);
            if (MV == 1) {
              float w8[8];
              VQ_CHUNK_W(VB2, pv2[u % VU][k % VN], ch, rv2, w8);
              for (int j = 0; j < 8; ++j) {
                v8[j] += w8[j];
              }
            }
            if (MV == 3) {
              float w8[8];
              VQ_CHUNK_W(VB2, pv2[u % VU][k % VN], ch, rv2, w8);
              for (int j = 0; j < 8; ++j) {
                vv2[(k * 8 + j) % VP2] = w8[j];
              }
            }
            for (int j = 0; j < 8; ++j) {
              vv[k * 8 + j] = v8[j];
            }
          }
        } else {
          const int ttv = VQ_VROW(tt);
          const DEVICE uint32_t* row1 = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1]
                                        + (int64_t)ttv * vc1_strides[2];
          const DEVICE uint32_t* row2 = vc2 + (int64_t)b * vc2_strides[0] + (int64_t)h * vc2_strides[1]
                                        + (int64_t)ttv * vc2_strides[2];
          if (MV <= 3) {
            vfac = vs0[(int64_t)b * vs0_strides[0] + (int64_t)h * vs0_strides[1] + (int64_t)ttv * vs0_strides[2]];
          }
          if (MV == 2 || MV == 3) {
            const float a1 = vs1[(int64_t)b * vs1_strides[0] + (int64_t)h * vs1_strides[1] + (int64_t)ttv * vs1_strides[2]];
            if (MV == 2) {
              vfac = (a1 > 0.0f) ? (vfac * f_k[0]) / a1 : 0.0f;
            } else {
              vfac2 = vfac * (a1 * f_k[1]);
            }
          }
          for (int k = 0; k < NCH; ++k) {
            const int ch = lp + k * P;
            float v8[8];
            if (MV == 0 || MV == 3) {
              VQ_CHUNK(VB1, row1, ch, rv1, v8);
            }
            if (MV == 1) {
              float w8[8];
              VQ_CHUNK(VB1, row1, ch, rv1, v8);
              VQ_CHUNK(VB2, row2, ch, rv2, w8);
              for (int j = 0; j < 8; ++j) {
                v8[j] += w8[j];
              }
            }
            if (MV == 2) {
              VQ_CHUNK(1, row1, ch, rv1, v8);
            }
            if (MV == 3) {
              float w8[8];
              VQ_CHUNK(1, row2, ch, rv2, w8);
              for (int j = 0; j < 8; ++j) {
                vv2[(k * 8 + j) % VP2] = w8[j];
              }
            }
            if (MV == 4 || MV == 5) {
              for (int j = 0; j < 8; ++j) {
                const int c = ch * 8 + j;
                const int64_t g = (int64_t)b * vgs_strides[0] + (int64_t)h * vgs_strides[1]
                                  + (int64_t)ttv * vgs_strides[2] + (int64_t)(c / VG) * vgs_strides[3];
                const float x = (float)vq_code<VB1>(row1, c) * static_cast<float>(vgs[g]);
                v8[j] = (MV == 4) ? x + static_cast<float>(vgz[g])
                                  : vq_round_to(vgs[0], vq_round_to(vgs[0], x) + static_cast<float>(vgz[g]));
              }
            }
            for (int j = 0; j < 8; ++j) {
              vv[k * 8 + j] = v8[j];
            }
          }
        }
      }
      if (vex) {
#if VQ_MIXED
        vfac = 1.0f;
        vfac2 = 0.0f;
#endif
        // APPEND with a window: this launch's append writes the window's last VQ_TNEW rows (split S - 1, as
        // attention_append.h runs it), so this split reads those tokens from the chunk vx itself
        const int vq_nw = vwr - (RV - VQ_TNEW);
#if VQ_MIXED
        for (int c = 0; c < VP2; ++c) {
          vv2[c] = 0.0f;
        }
#endif
        if (APPEND && HASWIN && vq_nw >= 0) {
          const int64_t nbase = (int64_t)b * vx_strides[0] + (int64_t)h * vx_strides[1] + (int64_t)vq_nw * vx_strides[2];
          for (int k = 0; k < NCH; ++k) {
            for (int j = 0; j < 8; ++j) {
              vv[k * 8 + j] = static_cast<float>(vx[nbase + (int64_t)((lp + k * P) * 8 + j) * vx_strides[3]]);
            }
          }
        } else {
          const int64_t base = (int64_t)b * vw_strides[0] + (int64_t)h * vw_strides[1] + (int64_t)vwr * vw_strides[2];
          for (int k = 0; k < NCH; ++k) {
            for (int j = 0; j < 8; ++j) {
              vv[k * 8 + j] = static_cast<float>(vw[base + (int64_t)((lp + k * P) * 8 + j) * vw_strides[3]]);
            }
          }
        }
      }
#if VQ_MIXED
      if (VROT && s == S - 1) {     // (every lane of the block: the butterflies shuffle)
        float vr_[NC];
        for (int c = 0; c < NC; ++c) {
          vr_[c] = vv[c];
        }
        VQ_ROTATE(vr_, f_vsig)
        for (int c = 0; c < NC; ++c) {
          vv[c] = vex ? vr_[c] : vv[c];
        }
      }
#endif
      for (int r = 0; r < QB; ++r) {
        const float wv = is_win ? w[u][r] : w[u][r] * vfac;
        for (int c = 0; c < NC; ++c) {
          acc[r][c] += wv * vv[c];
        }
        if (VPARTS == 2 && !is_win) {
          const float wv2 = w[u][r] * vfac2;
          for (int c = 0; c < NC; ++c) {
            acc2[r % (VPARTS == 2 ? QB : 1)][c % VP2] += wv2 * vv2[c % VP2];
          }
        }
      }
    }
  }

#include "partial_merge.h"
