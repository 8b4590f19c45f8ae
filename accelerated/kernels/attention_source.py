"""Decode-attention kernels over packed records (spec/attention.md): one body per kernel for CUDA and
Metal, written against the macros of a thin prelude (as accelerated/kernels/source.py).

Tolerance tier: plain float arithmetic (contraction allowed), exp2 of log2-scaled scores, float32
accumulation. Nothing here is bit-exact and the raw-operator lint of source.py does not apply.

Two kernels, flash-decoding style:

- `partial`: a threadgroup of NT threads per (split s, KV head h, batch x query group). Splits 0..S-1 take
  contiguous ranges of the encoded tokens, split S the exact window. The QB query rows of the group
  (GQA: query row r of KV head h is query head h*rep + r/L at position r%L) are loaded once, scaled by
  scale*log2(e) and, for the rotation family, rotated into the keys' domain (RHT with sigma, and tau for
  turboquant_prod). Lanes: P lanes share one token, each owning NCH chunks of 8 coordinates, so the query
  rows for its coordinates sit in registers and every packed word is read once by one lane. A token's
  score is the lanes' partial dot products summed by xor-shuffles; the online softmax and the value
  accumulation (in the values' rotated domain) run per lane; slots and warps are merged at the end.
  Output: per (row, split) the running max m, sum l and the weighted value sums (PARTS of them).
- `combine`: a threadgroup of D threads per query row merges the S encoded partials, applies the values'
  inverse rotation once, adds the window partial and writes the output row in the queries' dtype.

Method ids (template MK / MV): 0 turboquant, 1 turboquant_rvq, 2 rabitq, 3 turboquant_prod, 4 kivi,
5 mlx_affine. Keys of kivi (role k) are grouped per channel over KG tokens, values (role v) per token over
VG channels; mlx_affine groups per token, with its decode rounded to the input dtype.
"""
from __future__ import annotations

METHOD_IDS = {"turboquant": 0, "turboquant_rvq": 1, "rabitq": 2, "turboquant_prod": 3, "kivi": 4,
              "mlx_affine": 5}

PARTIAL_INPUTS = ["q", "f_scale", "f_k", "nenc",
                  "kc1", "kc2", "ks0", "ks1", "kgs", "kgz", "kw", "f_ktab1", "f_ktab2", "f_ksig", "f_ktau",
                  "vc1", "vc2", "vs0", "vs1", "vgs", "vgz", "vw", "f_vtab1", "f_vtab2", "flags"]
PARTIAL_OUTPUTS = ["o_acc", "o_ml"]
COMBINE_INPUTS = ["o_acc", "o_ml", "f_k", "f_vsig", "f_vtau", "q"]
COMBINE_OUTPUTS = ["out"]

# The names above are the bodies'. A launch passes fewer arrays (MLX's CUDA launch costs about 1 us per input,
# measured on the H200: a kernel of 26 inputs 42.7 us, of one 18.4 us): every float constant in one array
# `f_c` (C_* offsets; sign vectors after the tables, hkv * D each), the fields a method pair does not have
# and an absent window named by #define as another input of the launch (their code is dead for that pair).
C_SCALE, C_K, C_KTAB1, C_KTAB2, C_VTAB1, C_VTAB2, C_SIGNS = 0, 1, 4, 260, 516, 772, 1028
TABLE = 256                              # entries reserved per code table (2^bits <= 256)
_CONSTS = {
    "partial": {"f_scale": "(f_c + 0)", "f_k": "(f_c + 1)", "f_ktab1": "(f_c + 4)", "f_ktab2": "(f_c + 260)",
                "f_vtab1": "(f_c + 516)", "f_vtab2": "(f_c + 772)", "f_ksig": "(f_c + 1028)",
                "f_ktau": "(f_c + 1028 + (int)NBLOCK_Y * D)"},
    "combine": {"f_k": "(f_c + 1)", "f_vsig": "(f_c + 1028 + 2 * (int)NBLOCK_Y * D)",
                "f_vtau": "(f_c + 1028 + 3 * (int)NBLOCK_Y * D)"},
}


def _role_fields(r: str, m: int, haswin: bool) -> tuple[list[str], dict]:
    """(inputs a launch passes for role r with method id m, aliases of the others)."""
    used = [f"{r}c1"] + ([f"{r}c2"] if m in (1, 3) else []) + ([f"{r}s0"] if m <= 3 else []) \
        + ([f"{r}s1"] if m in (2, 3) else []) + ([f"{r}gs", f"{r}gz"] if m >= 4 else []) + ([f"{r}w"] if haswin else [])
    side = f"{r}s0" if m <= 3 else f"{r}gs"
    alias = {f"{r}c2": f"{r}c1", f"{r}s0": side, f"{r}s1": side, f"{r}gs": side, f"{r}gz": side, f"{r}w": "q"}
    return used, {k: v for k, v in alias.items() if k not in used}


def inputs(kind: str, mk: int = 0, mv: int = 0, haswin: bool = False) -> list[str]:
    """The arrays a launch of `kind` passes for a method pair (MK, MV) and window presence, in order."""
    if kind == "combine":
        return ["o_acc", "o_ml", "f_c", "q"]
    ku, _ = _role_fields("k", mk, haswin)
    vu, _ = _role_fields("v", mv, haswin)
    return ["q", "f_c", "nenc"] + ku + vu + ["flags"]


def aliases(kind: str, mk: int = 0, mv: int = 0, haswin: bool = False) -> str:
    """#define lines giving the body's names to what the launch passes."""
    lines = [f"#define {n} {e}" for n, e in _CONSTS[kind].items()]
    if kind == "partial":
        for r, m in (("k", mk), ("v", mv)):
            for n, to in _role_fields(r, m, haswin)[1].items():
                lines.append(f"#define {n} {to}")
                lines += [f"#define {n}{x} {to}{x}" for x in ("_shape", "_strides") if f"{n}{x}" in BODIES[kind]]
    return "\n".join(lines) + "\n"

# ---- helpers (header text, shared by both backends after the prelude) -----------------------------------
HELPERS = """
// code j of a packed row: word j / (32 / B), bits B * (j % (32 / B))      (spec/packing.md)
template <int B>
inline uint32_t vq_code(const DEVICE uint32_t* row, int j) {
  constexpr int PER = 32 / B;
  return (row[j / PER] >> (B * (j % PER))) & ((1u << B) - 1u);
}

// threadgroup table of a B-bit code stream: B = 2, 4: lut[byte * (8 / B) + k] = tab[code k of the byte];
// other B: a copy of tab (sign streams pass the table [+1, -1])
template <int B>
inline void vq_fill_table(TGMEM float* lut, const DEVICE float* tab, int tid, int nt) {
  if (B == 2 || B == 4) {
    constexpr int PERB = 8 / B;
    for (int i = tid; i < 256 * PERB; i += nt) {
      lut[i] = tab[((uint32_t)(i / PERB) >> (B * (i % PERB))) & ((1u << B) - 1u)];
    }
  } else {
    for (int i = tid; i < (1 << B); i += nt) {
      lut[i] = tab[i];
    }
  }
}

// B = 1, 2, 4: the 8 codes of chunk c (codes 8c .. 8c + 7, B bytes) lie in one word of the row; that word
// can be loaded early (vq_chunk_word) and decoded later (vq_chunk_w): one byte-table lookup per byte
template <int B>
inline uint32_t vq_chunk_word(const DEVICE uint32_t* row, int c) {
  return row[(c * B) / 4];
}

template <int B>
inline void vq_chunk_w(uint32_t w, int c, const TGMEM float* lut, THREAD float* out) {
  const int sh = 8 * ((c * B) % 4);
  if (B == 1) {
    const uint32_t byte = (w >> sh) & 255u;
    for (int k = 0; k < 8; ++k) {
      out[k] = lut[(byte >> k) & 1u];
    }
  } else {
    constexpr int PERB = 8 / B;
    for (int i = 0; i < B; ++i) {
      const uint32_t byte = (w >> (sh + 8 * i)) & 255u;
      for (int k = 0; k < PERB; ++k) {
        out[i * PERB + k] = lut[byte * PERB + k];
      }
    }
  }
}

// the 8 values of chunk c of a packed row: through its word for B = 1, 2, 4, else one code at a time
template <int B>
inline void vq_chunk(const DEVICE uint32_t* row, int c, const TGMEM float* lut, THREAD float* out) {
  if (B == 1 || B == 2 || B == 4) {
    vq_chunk_w<B>(vq_chunk_word<B>(row, c), c, lut, out);
  } else {
    for (int k = 0; k < 8; ++k) {
      out[k] = lut[vq_code<B>(row, 8 * c + k)];
    }
  }
}
"""

# ---- partial ------------------------------------------------------------------------------------------------
PARTIAL_BODY = """
  constexpr int NW = NT / 32;             // warps
  constexpr int TPW = 32 / P;             // token slots per warp
  constexpr int TPI = NW * TPW;           // tokens per iteration of the block
  constexpr int NCH = D / (8 * P);        // 8-coordinate chunks per lane
  constexpr int NC = NCH * 8;             // coordinates per lane
  constexpr bool KROT = MK <= 3;          // keys in the rotated domain
  constexpr bool VROT = MV <= 3;
  constexpr int KPARTS = (MK == 3) ? 2 : 1;
  constexpr int VPARTS = (MV == 3) ? 2 : 1;
  const int tid = (int)TID;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int slot = lane / P;
  const int lp = lane % P;
  const int s = (int)BLOCK_X;
  const int S = (int)NBLOCK_X - 1;        // encoded splits; split S is the window
  const int h = (int)BLOCK_Y;
  const int nqg = (int)NBLOCK_Z / (int)q_shape[0];
  const int b = (int)BLOCK_Z / nqg;
  const int qg = (int)BLOCK_Z % nqg;
  const int hkv = (int)NBLOCK_Y;
  const int hq = (int)q_shape[1];
  const int L = (int)q_shape[2];
  const int rep = hq / hkv;
  const int nq = rep * L;
  const int Q = nenc[0];                          // encoded tokens (the code buffers may hold more rows)
  const int R = HASWIN ? (int)kw_shape[2] : 0;   // no window: kw is a stand-in
  const int T = Q + R;
  const bool is_win = (s == S);
  int t0 = 0;
  int t1 = R;
  if (!is_win) {
    const int chunk = (Q + S - 1) / S;
    t0 = vq_min(Q, s * chunk);
    t1 = vq_min(Q, t0 + chunk);
  }

  // 1. the group's query rows, scaled (log2 domain), rotated into the keys' domain (encoded splits)
  SHARED(float, sq, QB * D);
  SHARED(float, sq2, QB * D);
  for (int i = tid; i < QB * D; i += NT) {
    const int r = qg * QB + i / D;
    float v = 0.0f;
    if (r < nq) {
      const int head = h * rep + r / L;
      const int pos = r % L;
      v = static_cast<float>(q[(int64_t)b * q_strides[0] + (int64_t)head * q_strides[1]
                               + (int64_t)pos * q_strides[2] + (int64_t)(i % D) * q_strides[3]]) * f_scale[0];
      if (KROT && !is_win) {
        v = v * f_ksig[h * D + i % D];
      }
    }
    sq[i] = v;
  }
  BARRIER();
  if (KROT && !is_win) {
    // H by ascending butterfly stages, then s_d (rotation.md); tau's RHT on top for turboquant_prod
    for (int pass = 0; pass < KPARTS; ++pass) {
      if (pass == 1) {
        for (int i = tid; i < QB * D; i += NT) {
          sq2[i] = sq[i] * f_ktau[h * D + i % D];
        }
        BARRIER();
      }
      for (int hh = 1; hh < D; hh <<= 1) {
        for (int i = tid; i < QB * D / 2; i += NT) {
          const int row = i / (D / 2);
          const int k = i % (D / 2);
          const int j = (k / hh) * 2 * hh + (k % hh);
          const int o = row * D + j;
          if (pass == 0) {
            const float a = sq[o];
            const float c = sq[o + hh];
            sq[o] = a + c;
            sq[o + hh] = a - c;
          } else {
            const float a = sq2[o];
            const float c = sq2[o + hh];
            sq2[o] = a + c;
            sq2[o + hh] = a - c;
          }
        }
        BARRIER();
      }
      for (int i = tid; i < QB * D; i += NT) {
        if (pass == 0) {
          sq[i] = sq[i] * f_k[0];
        } else {
          sq2[i] = sq2[i] * f_k[0];
        }
      }
      BARRIER();
    }
  }
  float qr[QB][NC];
  float qr2[KPARTS == 2 ? QB : 1][KPARTS == 2 ? NC : 1];
  for (int r = 0; r < QB; ++r) {
    for (int k = 0; k < NCH; ++k) {
      for (int j = 0; j < 8; ++j) {
        const int c = (lp + k * P) * 8 + j;
        qr[r][k * 8 + j] = sq[r * D + c];
        if (KPARTS == 2) {
          qr2[r % (KPARTS == 2 ? QB : 1)][(k * 8 + j) % (KPARTS == 2 ? NC : 1)] = sq2[r * D + c];
        }
      }
    }
  }
  // causal: query row r sits at position T - L + r % L and sees tokens at positions <= it
  int qpos[QB];
  for (int r = 0; r < QB; ++r) {
    qpos[r] = CAUSAL ? (T - L + (qg * QB + r) % L) : T;
  }

  // 2. code tables in threadgroup memory: byte tables for 2- and 4-bit streams (one lookup yields the
  //    8 / B values of a byte), the plain table otherwise
  SHARED(float, lk1, 1024);
  SHARED(float, lk2, 1024);
  SHARED(float, lv1, 1024);
  SHARED(float, lv2, 1024);
  // (rotation family: C1 or the sign table [+1, -1] in *tab1, C2 or the signs in *tab2)
  if (MK <= 3) {
    vq_fill_table<KB1>(lk1, f_ktab1, tid, NT);
  }
  if (MK == 1 || MK == 3) {
    vq_fill_table<KB2>(lk2, f_ktab2, tid, NT);
  }
  if (MV <= 3) {
    vq_fill_table<VB1>(lv1, f_vtab1, tid, NT);
  }
  if (MV == 1 || MV == 3) {
    vq_fill_table<VB2>(lv2, f_vtab2, tid, NT);
  }
  BARRIER();

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
  const int n_it = (t1 - t0 + TPB - 1) / TPB;
  for (int it = 0; it < n_it; ++it) {
    int tu[U];
    bool ok[U];
    for (int u = 0; u < U; ++u) {
      const int t = t0 + it * TPB + u * TPI + warp * TPW + slot;
      ok[u] = t < t1;
      tu[u] = ok[u] ? t : t0;             // a readable token for lanes past the end (result unused)
    }
    // -- the values' words and factors are loaded with the keys' (one memory latency per iteration)
    constexpr bool VPRE = MV <= 3 && (VB1 == 1 || VB1 == 2 || VB1 == 4) && (VB2 == 1 || VB2 == 2 || VB2 == 4);
    uint32_t pv1[VPRE ? U : 1][VPRE ? NCH : 1];
    uint32_t pv2[VPRE ? U : 1][VPRE ? NCH : 1];
    float pvf[U];
    float pvf2[U];
    if (VPRE && !is_win) {
      for (int u = 0; u < U; ++u) {
        const int tt = tu[u];
        const DEVICE uint32_t* row1 = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1]
                                      + (int64_t)tt * vc1_strides[2];
        const DEVICE uint32_t* row2 = vc2 + (int64_t)b * vc2_strides[0] + (int64_t)h * vc2_strides[1]
                                      + (int64_t)tt * vc2_strides[2];
        for (int k = 0; k < NCH; ++k) {
          pv1[u % (VPRE ? U : 1)][k % (VPRE ? NCH : 1)] = vq_chunk_word<VB1>(row1, lp + k * P);
          if (MV == 1 || MV == 3) {
            pv2[u % (VPRE ? U : 1)][k % (VPRE ? NCH : 1)] = vq_chunk_word<VB2>(row2, lp + k * P);
          }
        }
        pvf[u] = vs0[(int64_t)b * vs0_strides[0] + (int64_t)h * vs0_strides[1] + (int64_t)tt * vs0_strides[2]];
        pvf2[u] = 0.0f;
        if (MV == 2 || MV == 3) {
          const float a1 = vs1[(int64_t)b * vs1_strides[0] + (int64_t)h * vs1_strides[1] + (int64_t)tt * vs1_strides[2]];
          if (MV == 2) {
            pvf[u] = (a1 > 0.0f) ? (pvf[u] * f_k[0]) / a1 : 0.0f;
          } else {
            pvf2[u] = pvf[u] * (a1 * f_k[1]);
          }
        }
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
      if (is_win) {
        const int64_t base = (int64_t)b * kw_strides[0] + (int64_t)h * kw_strides[1] + (int64_t)tt * kw_strides[2];
        for (int k = 0; k < NCH; ++k) {
          for (int j = 0; j < 8; ++j) {
            kv[k * 8 + j] = static_cast<float>(kw[base + (int64_t)((lp + k * P) * 8 + j) * kw_strides[3]]);
          }
        }
      } else {
        const DEVICE uint32_t* row1 = kc1 + (int64_t)b * kc1_strides[0] + (int64_t)h * kc1_strides[1]
                                      + (int64_t)tt * kc1_strides[2];
        const DEVICE uint32_t* row2 = kc2 + (int64_t)b * kc2_strides[0] + (int64_t)h * kc2_strides[1]
                                      + (int64_t)tt * kc2_strides[2];
        if (MK <= 3) {
          kfac[u] = ks0[(int64_t)b * ks0_strides[0] + (int64_t)h * ks0_strides[1] + (int64_t)tt * ks0_strides[2]];
        }
        if (MK == 2 || MK == 3) {
          const float a1 = ks1[(int64_t)b * ks1_strides[0] + (int64_t)h * ks1_strides[1] + (int64_t)tt * ks1_strides[2]];
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
            vq_chunk<KB1>(row1, ch, lk1, v8);
          }
          if (MK == 1) {
            float w8[8];
            vq_chunk<KB1>(row1, ch, lk1, v8);
            vq_chunk<KB2>(row2, ch, lk2, w8);
            for (int j = 0; j < 8; ++j) {
              v8[j] += w8[j];
            }
          }
          if (MK == 2) {
            vq_chunk<1>(row1, ch, lk1, v8);
          }
          if (MK == 3) {
            float w8[8];
            vq_chunk<1>(row2, ch, lk2, w8);
            for (int j = 0; j < 8; ++j) {
              kv2[(k * 8 + j) % (KPARTS == 2 ? NC : 1)] = w8[j];
            }
          }
          if (MK == 4 || MK == 5) {
            for (int j = 0; j < 8; ++j) {
              const int c = ch * 8 + j;
              const int64_t g = (int64_t)b * kgs_strides[0] + (int64_t)h * kgs_strides[1]
                                + (int64_t)(MK == 4 ? tt / KG : tt) * kgs_strides[2]
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
        const bool use = ok[u] && (is_win ? Q + tu[u] : tu[u]) <= qpos[r] && qg * QB + r < nq;
        const float x = kfac[u] * part[u][r];
        w[u][r] = use ? x : NEG_INF;
        mb = vq_max(mb, w[u][r]);
      }
      const float mn = vq_max(m[r], mb);
      float alpha = 1.0f;
      if (mn != NEG_INF) {
        alpha = (m[r] == NEG_INF) ? 0.0f : vq_exp2(m[r] - mn);
        float ls = 0.0f;
        for (int u = 0; u < U; ++u) {
          w[u][r] = (w[u][r] == NEG_INF) ? 0.0f : vq_exp2(w[u][r] - mn);
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
    // -- values: this lane's coordinates (rotated domain for the rotation family), weighted
    for (int u = 0; u < U; ++u) {
      const int tt = tu[u];
      float vv[NC];
      float vv2[VP2];
      float vfac = 1.0f;
      float vfac2 = 0.0f;
      if (is_win) {
        const int64_t base = (int64_t)b * vw_strides[0] + (int64_t)h * vw_strides[1] + (int64_t)tt * vw_strides[2];
        for (int k = 0; k < NCH; ++k) {
          for (int j = 0; j < 8; ++j) {
            vv[k * 8 + j] = static_cast<float>(vw[base + (int64_t)((lp + k * P) * 8 + j) * vw_strides[3]]);
          }
        }
      } else if (VPRE) {
        vfac = pvf[u];
        vfac2 = pvf2[u];
        for (int k = 0; k < NCH; ++k) {
          const int ch = lp + k * P;
          float v8[8];
          vq_chunk_w<VB1>(pv1[u % (VPRE ? U : 1)][k % (VPRE ? NCH : 1)], ch, lv1, v8);
          if (MV == 1) {
            float w8[8];
            vq_chunk_w<VB2>(pv2[u % (VPRE ? U : 1)][k % (VPRE ? NCH : 1)], ch, lv2, w8);
            for (int j = 0; j < 8; ++j) {
              v8[j] += w8[j];
            }
          }
          if (MV == 3) {
            float w8[8];
            vq_chunk_w<VB2>(pv2[u % (VPRE ? U : 1)][k % (VPRE ? NCH : 1)], ch, lv2, w8);
            for (int j = 0; j < 8; ++j) {
              vv2[(k * 8 + j) % VP2] = w8[j];
            }
          }
          for (int j = 0; j < 8; ++j) {
            vv[k * 8 + j] = v8[j];
          }
        }
      } else {
        const DEVICE uint32_t* row1 = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1]
                                      + (int64_t)tt * vc1_strides[2];
        const DEVICE uint32_t* row2 = vc2 + (int64_t)b * vc2_strides[0] + (int64_t)h * vc2_strides[1]
                                      + (int64_t)tt * vc2_strides[2];
        if (MV <= 3) {
          vfac = vs0[(int64_t)b * vs0_strides[0] + (int64_t)h * vs0_strides[1] + (int64_t)tt * vs0_strides[2]];
        }
        if (MV == 2 || MV == 3) {
          const float a1 = vs1[(int64_t)b * vs1_strides[0] + (int64_t)h * vs1_strides[1] + (int64_t)tt * vs1_strides[2]];
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
            vq_chunk<VB1>(row1, ch, lv1, v8);
          }
          if (MV == 1) {
            float w8[8];
            vq_chunk<VB1>(row1, ch, lv1, v8);
            vq_chunk<VB2>(row2, ch, lv2, w8);
            for (int j = 0; j < 8; ++j) {
              v8[j] += w8[j];
            }
          }
          if (MV == 2) {
            vq_chunk<1>(row1, ch, lv1, v8);
          }
          if (MV == 3) {
            float w8[8];
            vq_chunk<1>(row2, ch, lv2, w8);
            for (int j = 0; j < 8; ++j) {
              vv2[(k * 8 + j) % VP2] = w8[j];
            }
          }
          if (MV == 4 || MV == 5) {
            for (int j = 0; j < 8; ++j) {
              const int c = ch * 8 + j;
              const int64_t g = (int64_t)b * vgs_strides[0] + (int64_t)h * vgs_strides[1]
                                + (int64_t)tt * vgs_strides[2] + (int64_t)(c / VG) * vgs_strides[3];
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

  // 4. merge the token slots of each warp (xor over slots), then the warps (in shared memory, in order)
  for (int off = P; off < 32; off <<= 1) {
    for (int r = 0; r < QB; ++r) {
      const float mo = SHFL_XOR(m[r], off);
      const float lo = SHFL_XOR(l[r], off);
      const float mx = vq_max(m[r], mo);
      const float a = (m[r] == NEG_INF) ? 0.0f : vq_exp2(m[r] - mx);
      const float bo = (mo == NEG_INF) ? 0.0f : vq_exp2(mo - mx);
      l[r] = l[r] * a + lo * bo;
      m[r] = mx;
      for (int c = 0; c < NC; ++c) {
        acc[r][c] = acc[r][c] * a + SHFL_XOR(acc[r][c], off) * bo;
      }
      if (VPARTS == 2) {
        for (int c = 0; c < NC; ++c) {
          const int rr = r % (VPARTS == 2 ? QB : 1);
          const int cc = c % (VPARTS == 2 ? NC : 1);
          acc2[rr][cc] = acc2[rr][cc] * a + SHFL_XOR(acc2[rr][cc], off) * bo;
        }
      }
    }
  }
  SHARED(float, sacc, QB * VPARTS * D);
  SHARED(float, sml, 2 * QB);
  for (int w = 0; w < NW; ++w) {
    // read the running (m, l) of warps 0..w-1 before any lane of warp w overwrites them
    float a[QB];
    float bo[QB];
    for (int r = 0; r < QB; ++r) {
      a[r] = 1.0f;
      bo[r] = 0.0f;
      if (w > 0 && warp == w) {
        const float mo = sml[2 * r];
        const float mx = vq_max(m[r], mo);
        a[r] = (m[r] == NEG_INF) ? 0.0f : vq_exp2(m[r] - mx);
        bo[r] = (mo == NEG_INF) ? 0.0f : vq_exp2(mo - mx);
        l[r] = l[r] * a[r] + sml[2 * r + 1] * bo[r];
        m[r] = mx;
      }
    }
    BARRIER();
    if (warp == w && slot == 0) {
      for (int r = 0; r < QB; ++r) {
        for (int k = 0; k < NCH; ++k) {
          for (int j = 0; j < 8; ++j) {
            const int c = (lp + k * P) * 8 + j;
            const int o = (r * VPARTS) * D + c;
            sacc[o] = acc[r][k * 8 + j] * a[r] + (w > 0 ? sacc[o] * bo[r] : 0.0f);
            if (VPARTS == 2) {
              sacc[o + D] = acc2[r % (VPARTS == 2 ? QB : 1)][(k * 8 + j) % (VPARTS == 2 ? NC : 1)] * a[r]
                            + (w > 0 ? sacc[o + D] * bo[r] : 0.0f);
            }
          }
        }
        if (lp == 0) {
          sml[2 * r] = m[r];
          sml[2 * r + 1] = l[r];
        }
      }
    }
    BARRIER();
  }
  // 5. this split's partial: o_acc (B, Hkv, NQ, S + 1, VPARTS, D), o_ml (B, Hkv, NQ, S + 1, 2)
  for (int i = tid; i < QB * VPARTS * D; i += NT) {
    const int r = qg * QB + i / (VPARTS * D);
    if (r < nq) {
      const int64_t row = (((int64_t)b * hkv + h) * nq + r) * (S + 1) + s;
      o_acc[row * VPARTS * D + i % (VPARTS * D)] = sacc[i];
    }
  }
  for (int i = tid; i < QB * 2; i += NT) {
    const int r = qg * QB + i / 2;
    if (r < nq) {
      const int64_t row = (((int64_t)b * hkv + h) * nq + r) * (S + 1) + s;
      o_ml[row * 2 + i % 2] = sml[i];
    }
  }
"""

# ---- combine ------------------------------------------------------------------------------------------------
COMBINE_BODY = """
  constexpr bool VROT = MV <= 3;
  constexpr int VPARTS = (MV == 3) ? 2 : 1;
  const int c = (int)TID;                 // one thread per coordinate
  const int r = (int)BLOCK_X;             // query row of this KV head
  const int h = (int)BLOCK_Y;
  const int b = (int)BLOCK_Z;
  const int nq = (int)NBLOCK_X;
  const int hkv = (int)NBLOCK_Y;
  const int S = (int)o_ml_shape[3] - 1;
  const int L = (int)q_shape[2];
  const int hq = (int)q_shape[1];
  const int rep = hq / hkv;
  const int64_t row0 = (((int64_t)b * hkv + h) * nq + r) * (S + 1);
  float me = NEG_INF;
  for (int s = 0; s < S; ++s) {
    me = vq_max(me, o_ml[(row0 + s) * 2]);
  }
  float le = 0.0f;
  float y = 0.0f;
  float y2 = 0.0f;
  for (int s = 0; s < S; ++s) {
    const float ms = o_ml[(row0 + s) * 2];
    const float w = (ms == NEG_INF) ? 0.0f : vq_exp2(ms - me);
    le += o_ml[(row0 + s) * 2 + 1] * w;
    y += o_acc[(row0 + s) * VPARTS * D + c] * w;
    if (VPARTS == 2) {
      y2 += o_acc[(row0 + s) * VPARTS * D + D + c] * w;
    }
  }
  SHARED(float, sy, D);
  if (VROT) {
    // inverse RHT: H, s_d, signs (rotation.md); turboquant_prod adds tau's inverse of the sketch part
    for (int pass = (VPARTS == 2 ? 0 : 1); pass < 2; ++pass) {
      sy[c] = (pass == 0) ? y2 : y;
      BARRIER();
      for (int hh = 1; hh < D; hh <<= 1) {
        float a = 0.0f;
        const bool lo = (c & hh) == 0;
        if (lo) {
          a = sy[c] + sy[c + hh];
        } else {
          a = sy[c - hh] - sy[c];
        }
        BARRIER();
        sy[c] = a;
        BARRIER();
      }
      if (pass == 0) {
        y = y + sy[c] * f_k[0] * f_vtau[h * D + c];
      } else {
        y = sy[c] * f_k[0] * f_vsig[h * D + c];
      }
      BARRIER();
    }
  }
  const float mw = o_ml[(row0 + S) * 2];
  const float lw = o_ml[(row0 + S) * 2 + 1];
  const float yw = o_acc[(row0 + S) * VPARTS * D + c];
  const float mt = vq_max(me, mw);
  const float we = (me == NEG_INF) ? 0.0f : vq_exp2(me - mt);
  const float ww = (mw == NEG_INF) ? 0.0f : vq_exp2(mw - mt);
  const float o = (y * we + yw * ww) / (le * we + lw * ww);
  const int head = h * rep + r / L;
  const int pos = r % L;
  out[(((int64_t)b * hq + head) * L + pos) * D + c] = static_cast<OT>(o);
"""

BODIES = {"partial": PARTIAL_BODY, "combine": COMBINE_BODY}

# ---- preludes -------------------------------------------------------------------------------------------------
CUDA_PRELUDE = """
#define TID threadIdx.x
#define BLOCK_X blockIdx.x
#define BLOCK_Y blockIdx.y
#define BLOCK_Z blockIdx.z
#define NBLOCK_X gridDim.x
#define NBLOCK_Y gridDim.y
#define NBLOCK_Z gridDim.z
#define SHARED(type, name, n) __shared__ type name[n]
#define BARRIER() __syncthreads()
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define WARP_SYNC() __syncwarp()
"""
CUDA_HEADER = """
#define DEVICE
#define TGMEM
#define THREAD
#define NEG_INF (-__int_as_float(0x7f800000))
__device__ inline float vq_max(float a, float b) { return fmaxf(a, b); }
__device__ inline int vq_min(int a, int b) { return a < b ? a : b; }
__device__ inline float vq_exp2(float x) { return exp2f(x); }
__device__ inline float vq_round_to(float, float x) { return x; }
__device__ inline float vq_round_to(__half, float x) { return __half2float(__float2half_rn(x)); }
__device__ inline float vq_round_to(__nv_bfloat16, float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
""" + HELPERS.replace("inline ", "__device__ inline ")

METAL_PRELUDE = """
#define TID thread_position_in_threadgroup.x
#define BLOCK_X threadgroup_position_in_grid.x
#define BLOCK_Y threadgroup_position_in_grid.y
#define BLOCK_Z threadgroup_position_in_grid.z
#define NBLOCK_X threadgroups_per_grid.x
#define NBLOCK_Y threadgroups_per_grid.y
#define NBLOCK_Z threadgroups_per_grid.z
#define SHARED(type, name, n) threadgroup type name[n]
#define BARRIER() threadgroup_barrier(metal::mem_flags::mem_threadgroup)
#define SHFL_XOR(v, m) metal::simd_shuffle_xor((v), (ushort)(m))
#define WARP_SYNC() metal::simdgroup_barrier(metal::mem_flags::mem_threadgroup)
"""
METAL_HEADER = """
#define DEVICE device
#define TGMEM threadgroup
#define THREAD thread
#define NEG_INF (-INFINITY)
inline float vq_exp2(float x) { return metal::exp2(x); }
inline float vq_max(float a, float b) { return metal::fmax(a, b); }
inline int vq_min(int a, int b) { return a < b ? a : b; }
inline float vq_round_to(float, float x) { return x; }
inline float vq_round_to(half, float x) { return static_cast<float>(static_cast<half>(x)); }
inline float vq_round_to(bfloat, float x) { return static_cast<float>(static_cast<bfloat>(x)); }
""" + HELPERS

PRELUDES = {"cuda": (CUDA_HEADER, CUDA_PRELUDE), "metal": (METAL_HEADER, METAL_PRELUDE)}


def assemble(kind: str, backend: str, mk: int = 0, mv: int = 0, haswin: bool = False) -> tuple[str, str]:
    """(header, source) of kernel `kind` ("partial" | "combine") for `backend` ("cuda" | "metal") and the
    launch's inputs (`inputs(kind, mk, mv, haswin)`)."""
    header, prelude = PRELUDES[backend]
    return header, prelude + aliases(kind, mk, mv, haswin) + BODIES[kind]
