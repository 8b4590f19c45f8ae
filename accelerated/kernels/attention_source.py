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
- `combine`: merges a query row's S encoded partials, applies the values' inverse rotation once, adds the
  window partial and writes the output row in the queries' dtype: its own launch (COMBINE_BODY, a threadgroup
  of CNT threads per query row, the splits spread over them), or on CUDA inside the partial launch (FUSED,
  accelerated.kernels.attention.FUSE_COMBINE: the last block of each query group to finish does it, found with
  an atomic count, with COMBINE_ROWS or the tensor-core kernel's COMBINE_ROWS_STRIDED; off by default, measured
  slower on the H200).

Method ids (template MK / MV): 0 turboquant, 1 turboquant_rvq, 2 rabitq, 3 turboquant_prod, 4 kivi,
5 mlx_affine. Keys of kivi (role k) are grouped per channel over KG tokens, values (role v) per token over
VG channels; mlx_affine groups per token, with its decode rounded to the input dtype.
"""
from __future__ import annotations

from veloxquant.accelerated.kernels.attention_partial import PARTIAL_LOOP, PARTIAL_OUTPUT
from veloxquant.accelerated.kernels.attention_tc import TC_CUDA_HEADER, TC_LOOP

METHOD_IDS = {"turboquant": 0, "turboquant_rvq": 1, "rabitq": 2, "turboquant_prod": 3, "kivi": 4,
              "mlx_affine": 5}

PARTIAL_INPUTS = ["q", "f_scale", "f_k", "nenc",
                  "kc1", "kc2", "ks0", "ks1", "kgs", "kgz", "kw", "f_ktab1", "f_ktab2", "f_ksig", "f_ktau",
                  "vc1", "vc2", "vs0", "vs1", "vgs", "vgz", "vw", "f_vtab1", "f_vtab2", "flags"]
PARTIAL_OUTPUTS = ["o_acc", "o_ml"]
FUSED_OUTPUTS = ["o_acc", "o_ml", "out"]      # the partial launch with the combine inside (FUSED)
APPEND_OUTPUTS = ["o_acc", "o_ml", "token"]   # ... with the decode step's append inside (APPEND; token: append.py's)
COMBINE_INPUTS = ["o_acc", "o_ml", "f_k", "f_vsig", "f_vtau", "q"]
COMBINE_OUTPUTS = ["out"]
COMBINE_APPEND_OUTPUTS = ["out", "summary"]   # ... with input `tok`, a chunk's token: its four checks over all groups

# The names above are the bodies'. A launch passes fewer arrays (MLX's CUDA launch costs about 1 us per input,
# measured on the H200: a kernel of 26 inputs 42.7 us, of one 18.4 us): every float constant in one array
# `f_c` (C_* offsets; sign vectors after the tables, hkv * D each), the fields a method pair does not have
# and an absent window named by #define as another input of the launch (their code is dead for that pair).
C_SCALE, C_K, C_KTAB1, C_KTAB2, C_VTAB1, C_VTAB2, C_SIGNS = 0, 1, 4, 260, 516, 772, 1028
TABLE = 256                              # entries reserved per code table (2^bits <= 256)
_CONSTS = {
    "partial": {"f_scale": "(f_c + 0)", "f_k": "(f_c + 1)", "f_ktab1": "(f_c + 4)", "f_ktab2": "(f_c + 260)",
                "f_vtab1": "(f_c + 516)", "f_vtab2": "(f_c + 772)", "f_ksig": "(f_c + 1028)",
                "f_ktau": "(f_c + 1028 + (int)NBLOCK_Y * D)", "f_vsig": "(f_c + 1028 + 2 * (int)NBLOCK_Y * D)",
                "f_vtau": "(f_c + 1028 + 3 * (int)NBLOCK_Y * D)"},
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


def inputs(kind: str, mk: int = 0, mv: int = 0, haswin: bool = False, fused: bool = False,
           append: bool = False, starts: bool = False) -> list[str]:
    """The arrays a launch of `kind` passes for a method pair (MK, MV), window presence and (partial) whether
    the combine runs inside it (then `cnt`, the per-group counters, comes last) or the decode step's append
    (`append`: the new keys and values and append.py's constant arrays before `flags`), and `starts`: the batch
    rows' first attended tokens (`rstart`, (B,) int32, last: a left-padded batch), in order."""
    if kind == "combine":
        return ["o_acc", "o_ml", "f_c", "q"] + (["tok"] if append else [])
    ku, _ = _role_fields("k", mk, haswin)
    vu, _ = _role_fields("v", mv, haswin)
    return (["q", "f_c", "nenc"] + ku + vu + (["kx", "kconst", "vx", "vconst"] if append else []) + ["flags"]
            + (["cnt"] if fused else []) + (["rstart"] if starts else []))


def aliases(kind: str, mk: int = 0, mv: int = 0, haswin: bool = False, fused: bool = False,
            append: bool = False, starts: bool = False) -> str:
    """#define lines giving the body's names to what the launch passes."""
    lines = [f"#define {n} {e}" for n, e in _CONSTS[kind].items()]
    if kind == "partial":       # the tokens this launch appends (APPEND), the last of the nenc encoded ones
        lines.append(f"#define VQ_TNEW {'((int)kx_shape[2])' if append else '0'}")
        lines.append(f"#define VQ_STARTS {int(starts)}")
        if not starts:          # (code VQ_STARTS = 0 never runs)
            lines.append("#define rstart nenc")
    if kind == "partial" and not fused:   # the combine's names, in code that FUSED = 0 never runs
        lines += ["#define cnt nenc", "#define out ((DEVICE OT*)o_acc)"]
    if kind == "partial":
        for r, m in (("k", mk), ("v", mv)):
            for n, to in _role_fields(r, m, haswin)[1].items():
                lines.append(f"#define {n} {to}")
                lines += [f"#define {n}{x} {to}{x}" for x in ("_shape", "_strides") if f"{n}{x}" in BODIES[kind]]
    return "\n".join(lines) + "\n"

# ---- helpers (header text, shared by both backends after the prelude) -----------------------------------
HELPERS = """
// loops a threadgroup runs once (set-up, merge, combine; over threadgroup or device memory, never a register
// array): CUDA with accelerated.kernels.attention.COLD_LOOPS defines VQ_COLD as `#pragma unroll 1` (less code
// to fetch once per threadgroup; same operations in the same order), elsewhere it is nothing
#ifndef VQ_COLD
#define VQ_COLD
#endif
// a loop over the U token slots that must be unrolled (its indices into register arrays constant): CUDA's prelude
// defines it as `#pragma unroll`; elsewhere nothing (Metal not measured)
#ifndef VQ_UNROLL
#define VQ_UNROLL
#endif
// code j of a packed row: word j / (32 / B), bits B * (j % (32 / B))      (spec/packing.md)
template <int B>
inline uint32_t vq_code(const DEVICE uint32_t* row, int j) {
  constexpr int PER = 32 / B;
  return (row[j / PER] >> (B * (j % PER))) & ((1u << B) - 1u);
}

// B = 1, 2, 4: the 8 codes of chunk c (codes 8c .. 8c + 7, B bytes) lie in one word of the row; that word
// can be loaded early (vq_chunk_word) and split into codes later (vq_codes_w)
template <int B>
inline uint32_t vq_chunk_word(const DEVICE uint32_t* row, int c) {
  return row[(c * B) / 4];
}

// the 8 codes of chunk c (codes 8c .. 8c + 7) of a packed row: from its word for B = 1, 2, 4 (vq_chunk_word),
// else one code at a time; the body looks their values up with a warp shuffle (VQ_LOOKUP).
template <int B>
inline void vq_codes_w(uint32_t w, int c, THREAD uint32_t* out) {
  const int sh = 8 * ((c * B) % 4);
  for (int k = 0; k < 8; ++k) {
    out[k] = (w >> (sh + B * k)) & ((1u << B) - 1u);
  }
}

template <int B>
inline void vq_codes(const DEVICE uint32_t* row, int c, THREAD uint32_t* out) {
  if (B == 1 || B == 2 || B == 4) {
    vq_codes_w<B>(vq_chunk_word<B>(row, c), c, out);
  } else {
    for (int k = 0; k < 8; ++k) {
      out[k] = vq_code<B>(row, 8 * c + k);
    }
  }
}

// one stage of the ascending butterfly of H (rotation.md) over `rows` rows of D values of a: pairs
// (j, j + hh) -> (x0 + x1, x0 - x1), shared by threads t, t + nt, ... (the caller puts a barrier after it)
template <int D>
inline void vq_butterfly_stage(TGMEM float* a, int rows, int hh, int t, int nt) {
  VQ_COLD
  for (int i = t; i < rows * D / 2; i += nt) {
    const int k = i % (D / 2);
    const int o = (i / (D / 2)) * D + (k / hh) * 2 * hh + (k % hh);
    const float x0 = a[o];
    const float x1 = a[o + hh];
    a[o] = x0 + x1;
    a[o + hh] = x0 - x1;
  }
}
"""

# ---- partial ------------------------------------------------------------------------------------------------
PARTIAL_SETUP = """
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
    // APPEND: split S - 1 takes the VQ_TNEW tokens it encoded (append_block), splits 0 .. S - 2 the ones before
    // row starts (a left-padded batch): batch row b attends to its tokens from rstart[b] on, split evenly
    const int QO = Q - VQ_TNEW;
    const int SO = APPEND ? S - 1 : S;
    const int lo0 = VQ_STARTS ? vq_min((int)rstart[b], QO) : 0;
    const int chunk = (QO - lo0 + SO - 1) / SO;
    t0 = (APPEND && s == S - 1) ? QO : vq_min(QO, lo0 + s * chunk);
    t1 = (APPEND && s == S - 1) ? Q : vq_min(QO, t0 + chunk);
  }

  // 1. the group's query rows, scaled (log2 domain), rotated into the keys' domain (encoded splits)
  SHARED(float, sq, QB * D);
  SHARED(float, sq2, QB * D);
  VQ_COLD
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
        VQ_COLD
        for (int i = tid; i < QB * D; i += NT) {
          sq2[i] = sq[i] * f_ktau[h * D + i % D];
        }
        BARRIER();
      }
      TGMEM float* rows = (pass == 0) ? sq : sq2;
      VQ_COLD
      for (int hh = 1; hh < D; hh <<= 1) {
        vq_butterfly_stage<D>(rows, QB, hh, tid, NT);
        BARRIER();
      }
      VQ_COLD
      for (int i = tid; i < QB * D; i += NT) {
        rows[i] = rows[i] * f_k[0];
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

  // 2. code tables (rotation family: C1 or the sign table [+1, -1] in *tab1, C2 or the signs in *tab2; at
  //    most 4 bits per code, spec/formats.toml) in one register per lane: lane i holds entry i mod 2^B, and
  //    a lookup is a shuffle from lane `code` (a plain table in threadgroup memory measured the same on the
  //    H200; the byte tables before it put 32 random reads on 16 banks)
#define VQ_LOOKUP(reg, code) SHFL_IDX((reg), (int)(code))
  const float rk1 = f_ktab1[lane % (1 << KB1)];
  const float rk2 = f_ktab2[lane % (1 << KB2)];
  const float rv1 = f_vtab1[lane % (1 << VB1)];
  const float rv2 = f_vtab2[lane % (1 << VB2)];

"""
# ---- the decode step's append inside the partial launch (APPEND) ----------------------------------------------
# Split S - 1 of each (batch, KV head) first encodes the chunk's new keys and values with source.py's encode body
# (append.encode_scope: the append kernel's bytes, bit for bit) into rows nenc - t .. nenc - 1 of the buffers, then
# attends over those rows like any split; no other threadgroup reads them. Warp 0 takes the keys and warp 1 the
# values, each scope seeing a grid of one single-warp group per (batch, KV head) (GROUP), so its barriers are warp
# syncs; the threadgroup barrier after both publishes the rows to the other warps. Saves the append's own launch
# (a custom-kernel call, ~5-10 us of host time per layer on the H200's host, and its ~6 us latency chain on the
# GPU, now overlapped with the other splits). Needs one query group per KV head (nqg = 1: the group's only block
# writes). The code constants are compiled in (template KCB1, ..., VCGS: methods.code_constants).
ENCODE_MACROS = ("LANE", "SHFL_DOWN", "SHFL", "ANY", "BALLOT", "ADD", "SUB", "MUL", "DIV", "SQRT", "NEG", "ABS",
                 "FLIP", "MINF", "MAXF", "PIN", "TO_F32", "TO_TS", "VQ_OROW", "VQ_B1", "VQ_B2", "VQ_GS", "VQ_KR")


def encode_macros(be: str) -> tuple[str, str]:
    """(header, macro lines) the encode body needs beside the attention prelude, from source.py's preludes."""
    from veloxquant.accelerated.kernels import append as kappend, source_preludes as sp
    header, prelude = sp.PRELUDES[be]
    lines = [ln for ln in prelude.splitlines() if ln.startswith("#define ")
             and ln.split()[1].split("(")[0] in ENCODE_MACROS]
    return header, "\n".join(lines) + "\n" + kappend._ALIAS[be]


def append_block(mk: int, mv: int) -> str:
    """The APPEND prologue of the partial body for a method pair (placed before the aliases: the encode body's own
    names f_k, sig, ... are locals there)."""
    from veloxquant.accelerated.kernels import append as kappend
    names = {v: k for k, v in METHOD_IDS.items()}
    scopes = []
    for index, (r, m) in enumerate((("k", mk), ("v", mv))):
        alias = _role_fields(r, m, False)[1]
        side = ("gs", "gz") if m >= 4 else ("s0", "s1")
        out = {o: alias.get(f"{r}{n}", f"{r}{n}") for o, n in zip(("codes1", "codes2", "f_s1", "f_s2"),
                                                                   ("c1", "c2", *side))}
        R = r.upper()
        scopes.append(kappend.encode_scope(index, names[m], m=str(m), codes=(f"{R}CB1", f"{R}CB2", f"{R}CGS"), ts=f"{R}TS",
                                           x=f"{r}x", const=f"{r}const", out=out, fault="token",
                                           cap=f"(int){out['codes1']}_shape[2]", base=f"nenc[0] - (int){r}x_shape[2]",
                                           shared=r))
    # each role's threadgroup arrays at kernel scope (Metal), apart: the two scopes run at once in two warps
    return kappend.encode_shared("k") + kappend.encode_shared("v") + """
  if ((int)BLOCK_X == (int)NBLOCK_X - 2) {
#define GROUP ((int)BLOCK_Z * (int)NBLOCK_Y + (int)BLOCK_Y)
#define NGROUPS ((int)NBLOCK_Z * (int)NBLOCK_Y)
#define WARP 0
#define NWARPS 1
#undef BARRIER
#define BARRIER() WARP_SYNC()
    if ((int)TID / 32 == 0) {""" + scopes[0] + """    } else if ((int)TID / 32 == 1) {""" + scopes[1] + """    }
#undef GROUP
#undef NGROUPS
#undef WARP
#undef NWARPS
#undef BARRIER
#define BARRIER() VQ_BARRIER()
    BARRIER();
  }
"""


# steps 3-5: accelerated/kernels/attention_partial.py
PARTIAL_BODY = PARTIAL_SETUP + PARTIAL_LOOP + PARTIAL_OUTPUT

# One row's end, shared by the combine launch and the fused scalar combine: the values' inverse rotation of cy (cy2:
# turboquant_prod's sketch part), the window's partial (split S) merged in, the division by the total sum, the row
# written in the queries' dtype. Row r, its partials from row0, the encoded splits' max me and sum le.
COMBINE_ROW_END = """
  if (VROT) {
    // inverse RHT: H, s_d, signs (rotation.md); turboquant_prod first adds tau's inverse of the sketch part
    for (int pass = (VPARTS == 2 ? 0 : 1); pass < 2; ++pass) {
      VQ_COLD
      for (int hh = 1; hh < D; hh <<= 1) {
        vq_butterfly_stage<D>((pass == 0) ? cy2 : cy, 1, hh, CT, CNT);
        BARRIER();
      }
      for (int c = CT; c < D; c += CNT) {
        if (pass == 0) {
          cy[c] = cy[c] + cy2[c] * f_k[0] * f_vtau[h * D + c];
        } else {
          cy[c] = cy[c] * f_k[0] * f_vsig[h * D + c];
        }
      }
      BARRIER();
    }
  }
  // (d) the window's partial (split S), the division by the total sum, the row in the queries' dtype
  const float mw = o_ml[(row0 + S) * 2];
  const float lw = o_ml[(row0 + S) * 2 + 1];
  const float mt = vq_max(me, mw);
  const float we = (me == NEG_INF) ? 0.0f : vq_exp2(me - mt);
  const float ww = (mw == NEG_INF) ? 0.0f : vq_exp2(mw - mt);
  const int head = h * rep + r / L;
  const int pos = r % L;
  for (int c = CT; c < D; c += CNT) {
    const float o = (cy[c] * we + o_acc[(row0 + S) * VPARTS * D + c] * ww) / (le * we + lw * ww);
    out[(((int64_t)b * hq + head) * L + pos) * D + c] = static_cast<OT>(o);
  }
"""

# ---- combine ------------------------------------------------------------------------------------------------
# Rows CR0 .. CR1 - 1 of KV head h: merge the S encoded splits' partials (max, sum, weighted values), apply the
# values' inverse rotation once, add the window's partial (split S) and write the rows in the queries' dtype.
# Threads CT = 0 .. CNT - 1 share the D coordinates; cy, cy2: D floats of threadgroup memory each.
COMBINE_ROWS = """
  for (int r = CR0; r < CR1; ++r) {
    const int64_t row0 = (((int64_t)b * hkv + h) * nq + r) * (S + 1);
    float me = NEG_INF;
    for (int s2 = 0; s2 < S; ++s2) {
      me = vq_max(me, o_ml[(row0 + s2) * 2]);
    }
    float le = 0.0f;
    for (int s2 = 0; s2 < S; ++s2) {
      const float ms = o_ml[(row0 + s2) * 2];
      le += o_ml[(row0 + s2) * 2 + 1] * ((ms == NEG_INF) ? 0.0f : vq_exp2(ms - me));
    }
    for (int c = CT; c < D; c += CNT) {
      float y = 0.0f;
      float y2 = 0.0f;
      for (int s2 = 0; s2 < S; ++s2) {
        const float ms = o_ml[(row0 + s2) * 2];
        const float w = (ms == NEG_INF) ? 0.0f : vq_exp2(ms - me);
        y += o_acc[(row0 + s2) * VPARTS * D + c] * w;
        if (VPARTS == 2) {
          y2 += o_acc[(row0 + s2) * VPARTS * D + D + c] * w;
        }
      }
      cy[c] = y;
      if (VPARTS == 2) {
        cy2[c] = y2;
      }
    }
    BARRIER();
""" + COMBINE_ROW_END + """    BARRIER();                             // cy is the next row's
  }
"""

COMBINE_ROWS_STRIDED = """
  // (the tensor-core kernel's: all NR rows at once, the splits strided over the threads. Measured with it on the
  // H200; the scalar kernels keep COMBINE_ROWS, which measured faster there: docs/decode-step-analysis.md)
  const int NR = CR1 - CR0;
  const int64_t crow0 = ((int64_t)b * hkv + h) * nq + CR0;     // row CR0 + r: (crow0 + r) * (S + 1)
  // (a) each row's max over the splits: per thread, then a tree over the CNT threads (a power of two)
  for (int r = 0; r < CQB; ++r) {
    float pm = NEG_INF;
    if (r < NR) {
      for (int s2 = CT; s2 < S; s2 += CNT) {
        pm = vq_max(pm, o_ml[((crow0 + r) * (S + 1) + s2) * 2]);
      }
    }
    cred[r * CNT + CT] = pm;
  }
  VQ_COLD
  for (int half = CNT / 2; half > 0; half >>= 1) {
    BARRIER();
    VQ_COLD
    for (int i = CT; i < CQB * half; i += CNT) {
      const int o = (i / half) * CNT + i % half;
      cred[o] = vq_max(cred[o], cred[o + half]);
    }
  }
  BARRIER();
  float me[CQB];
  for (int r = 0; r < CQB; ++r) {
    me[r] = cred[r * CNT];
  }
  BARRIER();
  // (b) each row's sum of the splits' sums, rescaled to its max, likewise
  for (int r = 0; r < CQB; ++r) {
    float pl = 0.0f;
    if (r < NR) {
      for (int s2 = CT; s2 < S; s2 += CNT) {
        const int64_t o = ((crow0 + r) * (S + 1) + s2) * 2;
        const float ms = o_ml[o];
        pl += (ms == NEG_INF) ? 0.0f : o_ml[o + 1] * vq_exp2(ms - me[r]);
      }
    }
    cred[r * CNT + CT] = pl;
  }
  VQ_COLD
  for (int half = CNT / 2; half > 0; half >>= 1) {
    BARRIER();
    VQ_COLD
    for (int i = CT; i < CQB * half; i += CNT) {
      const int o = (i / half) * CNT + i % half;
      cred[o] = cred[o] + cred[o + half];
    }
  }
  BARRIER();
  float le[CQB];
  for (int r = 0; r < CQB; ++r) {
    le[r] = cred[r * CNT];
  }
  // (c) the weighted value sums: CNT >= D: thread CT takes coordinate CT % D and every CG-th split from CT / D
  //     (partials summed in order below); CNT < D: coordinates CT, CT + CNT, ... and every split
  constexpr int CG = (CNT >= D) ? CNT / D : 1;
  constexpr int CC = (CNT >= D) ? 1 : D / CNT;
  const int gi = (CNT >= D) ? CT / D : 0;
  for (int k = 0; k < CC; ++k) {
    const int c = (CNT >= D) ? CT % D : CT + k * CNT;
    float y[CQB];
    float y2[CQB];
    for (int r = 0; r < CQB; ++r) {
      y[r] = 0.0f;
      y2[r] = 0.0f;
    }
    if (gi < CG) {
      for (int s2 = gi; s2 < S; s2 += CG) {
        for (int r = 0; r < CQB; ++r) {
          if (r < NR) {
            const int64_t row = (crow0 + r) * (S + 1) + s2;
            const float ms = o_ml[row * 2];
            const float w = (ms == NEG_INF) ? 0.0f : vq_exp2(ms - me[r]);
            y[r] += o_acc[row * VPARTS * D + c] * w;
            if (VPARTS == 2) {
              y2[r] += o_acc[row * VPARTS * D + D + c] * w;
            }
          }
        }
      }
    }
    for (int r = 0; r < CQB; ++r) {
      if (CG == 1) {
        cy[r * D + c] = y[r];
        if (VPARTS == 2) {
          cy2[r * D + c] = y2[r];
        }
      } else if (gi < CG) {
        cpart[((r * VPARTS) * CG + gi) * D + c] = y[r];
        if (VPARTS == 2) {
          cpart[((r * VPARTS + 1) * CG + gi) * D + c] = y2[r];
        }
      }
    }
  }
  if (CG > 1) {
    BARRIER();
    VQ_COLD
    for (int i = CT; i < CQB * D; i += CNT) {
      const int r = i / D;
      const int c = i % D;
      float y = 0.0f;
      float y2 = 0.0f;
      for (int q2 = 0; q2 < CG; ++q2) {
        y += cpart[((r * VPARTS) * CG + q2) * D + c];
        if (VPARTS == 2) {
          y2 += cpart[((r * VPARTS + 1) * CG + q2) * D + c];
        }
      }
      cy[i] = y;
      if (VPARTS == 2) {
        cy2[i] = y2;
      }
    }
  }
  BARRIER();
  if (VROT) {
    // inverse RHT of every row: H, s_d, signs (rotation.md); turboquant_prod first adds tau's inverse of the
    // sketch part
    for (int pass = (VPARTS == 2 ? 0 : 1); pass < 2; ++pass) {
      VQ_COLD
      for (int hh = 1; hh < D; hh <<= 1) {
        vq_butterfly_stage<D>((pass == 0) ? cy2 : cy, NR, hh, CT, CNT);
        BARRIER();
      }
      VQ_COLD
      for (int i = CT; i < NR * D; i += CNT) {
        const int c = i % D;
        if (pass == 0) {
          cy[i] = cy[i] + cy2[i] * f_k[0] * f_vtau[h * D + c];
        } else {
          cy[i] = cy[i] * f_k[0] * f_vsig[h * D + c];
        }
      }
      BARRIER();
    }
  }
  // (d) the window's partial (split S), the division by the total sum, the output rows in the queries' dtype
  VQ_COLD
  for (int i = CT; i < NR * D; i += CNT) {
    const int r = i / D;
    const int c = i % D;
    const int64_t roww = (crow0 + r) * (S + 1) + S;
    float mer = NEG_INF;
    float ler = 0.0f;
    for (int r2 = 0; r2 < CQB; ++r2) {
      mer = (r2 == r) ? me[r2] : mer;
      ler = (r2 == r) ? le[r2] : ler;
    }
    const float mw = o_ml[roww * 2];
    const float lw = o_ml[roww * 2 + 1];
    const float mt = vq_max(mer, mw);
    const float we = (mer == NEG_INF) ? 0.0f : vq_exp2(mer - mt);
    const float ww = (mw == NEG_INF) ? 0.0f : vq_exp2(mw - mt);
    const int rr = CR0 + r;
    const int head = h * rep + rr / L;
    const int pos = rr % L;
    const float o = (cy[i] * we + o_acc[roww * VPARTS * D + c] * ww) / (ler * we + lw * ww);
    out[(((int64_t)b * hq + head) * L + pos) * D + c] = static_cast<OT>(o);
  }
"""

# the combine as its own launch: a threadgroup of CNT threads (a multiple of D, CG = CNT / D groups of D) per query
# row, the splits spread over the threads: each split's weight exp2(m_s - m) once (threadgroup memory), then
# thread CT sums coordinate CT % D over splits CT / D, + CG, ... with independent loads, and the CG group sums
# are added. One thread per coordinate walking all S splits (COMBINE_ROWS, the fused scalar kernel's) was a
# chain of S dependent round trips to L2: ~8-10 us per launch on the H200 at S = 16-32 (seventh pass).
MAX_SPLITS = 2048          # splits (S + 1 with the window) a combine launch takes: accelerated.kernels.attention
                           # caps them (MAX_THREADGROUPS; the tensor-core loop's one wave is far fewer)
COMBINE_BODY = """
  constexpr bool VROT = MV <= 3;
  constexpr int VPARTS = (MV == 3) ? 2 : 1;
  constexpr int CG = CNT / D;
  constexpr int NWC = CNT / 32;
  const int h = (int)BLOCK_Y;
  const int b = (int)BLOCK_Z;
  const int r = (int)BLOCK_X;
  const int nq = (int)NBLOCK_X;
  const int hkv = (int)NBLOCK_Y;
  const int S = (int)o_ml_shape[3] - 1;
  const int L = (int)q_shape[2];
  const int hq = (int)q_shape[1];
  const int rep = hq / hkv;
  const int CT = (int)TID;
  const int lane = CT % 32;
  const int wc = CT / 32;
  SHARED(float, cw, """ + str(MAX_SPLITS) + """);
  SHARED(float, cred, 2 * NWC);
  SHARED(float, cpart, VPARTS * CNT);
  SHARED(float, cy, D);
  SHARED(float, cy2, VPARTS == 2 ? D : 1);
  const int64_t row0 = (((int64_t)b * hkv + h) * nq + r) * (S + 1);
  // (a) m: the splits' maxima, strided over the threads, then over a warp's lanes and the warps
  float pm = NEG_INF;
  for (int s2 = CT; s2 < S; s2 += CNT) {
    pm = vq_max(pm, o_ml[(row0 + s2) * 2]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    pm = vq_max(pm, SHFL_XOR(pm, o));
  }
  if (lane == 0) {
    cred[wc] = pm;
  }
  BARRIER();
  float me = NEG_INF;
  for (int w = 0; w < NWC; ++w) {
    me = vq_max(me, cred[w]);
  }
  // (b) each split's weight, and l: the splits' sums times their weights, likewise
  float pl = 0.0f;
  for (int s2 = CT; s2 < S; s2 += CNT) {
    const float ms = o_ml[(row0 + s2) * 2];
    const float w = (ms == NEG_INF) ? 0.0f : vq_exp2(ms - me);
    cw[s2] = w;
    pl += o_ml[(row0 + s2) * 2 + 1] * w;
  }
  for (int o = 16; o > 0; o >>= 1) {
    pl += SHFL_XOR(pl, o);
  }
  if (lane == 0) {
    cred[NWC + wc] = pl;
  }
  BARRIER();
  float le = 0.0f;
  for (int w = 0; w < NWC; ++w) {
    le += cred[NWC + w];
  }
  // (c) the weighted value sums: coordinate CT % D over splits CT / D, + CG, ..., then the CG groups added
  {
    const int c = CT % D;
    float y = 0.0f;
    float y2 = 0.0f;
    for (int s2 = CT / D; s2 < S; s2 += CG) {
      const float w = cw[s2];
      y += o_acc[(row0 + s2) * VPARTS * D + c] * w;
      if (VPARTS == 2) {
        y2 += o_acc[(row0 + s2) * VPARTS * D + D + c] * w;
      }
    }
    cpart[CT] = y;
    if (VPARTS == 2) {
      cpart[CNT + CT] = y2;
    }
  }
  BARRIER();
  for (int c = CT; c < D; c += CNT) {
    float y = 0.0f;
    float y2 = 0.0f;
    for (int g = 0; g < CG; ++g) {
      y += cpart[g * D + c];
      if (VPARTS == 2) {
        y2 += cpart[CNT + g * D + c];
      }
    }
    cy[c] = y;
    if (VPARTS == 2) {
      cy2[c] = y2;
    }
  }
  BARRIER();
""" + COMBINE_ROW_END

# A chunk's token (append.py's layout, (2 roles, groups, 2): an APPEND partial's, one group per batch and KV head, or
# the append kernel's, one per threadgroup) ORed over the groups into `summary`, (2, 1, 2): the chunk's four checks,
# the append kernel's token of one group. The host reads only this: 4 bytes, which MLX's CUDA allocator keeps in its
# managed scalar pool. A host read of the token itself (32 bytes for 8 KV heads: device memory) moved it into a fresh
# managed allocation which MLX later recycled as a kernel's output, and the GPU's first write to it stalled the step
# by 70-250 us (H200, 2026-12-01, tools/gpu_timeline.py: once per step, at the first partial that reused it).
COMBINE_SUMMARY = """
  if ((int)BLOCK_X == 0 && (int)BLOCK_Y == 0 && (int)BLOCK_Z == 0 && (int)TID < 4) {
    const int ng = (int)tok_shape[1];
    bool hit = false;
    for (int g = 0; g < ng; ++g) {
      hit = hit || tok[((int)TID / 2 * ng + g) * 2 + (int)TID % 2];
    }
    summary[(int)TID] = hit;
  }
"""

# the combine inside the partial launch (FUSED): the block of a (batch x query group, KV head) that finishes
# last merges its S + 1 splits. Each block makes its partial visible device-wide and counts itself in cnt
# (persistent, zero between launches); the block that reads S is last and sets the count back to zero.
def _partial_combine(rows: str, strided: bool) -> str:
    return """
  SHARED(int, slast, 1);                 // kernel scope: Metal compiles this text too (FUSED = 0 there)
  if (FUSED) {
    THREADFENCE();
    BARRIER();
    if (tid == 0) {
      slast[0] = (ATOMIC_ADD(cnt, (int)BLOCK_Z * hkv + h) == S) ? 1 : 0;
    }
    BARRIER();
    if (slast[0] != 0) {
      THREADFENCE();
      TGMEM float* cy = sq;
      TGMEM float* cy2 = sq2;
      const int CR0 = qg * QB;
      const int CR1 = vq_min(nq, qg * QB + QB);
      const int CT = tid;
      constexpr int CNT = NT;
""" + ("""      constexpr int CQB = QB;
      SHARED(float, cred, CQB * CNT);
      SHARED(float, cpart, (CNT > D) ? CQB * VPARTS * CNT : 1);
""" if strided else "") + rows + """
      if (tid == 0) {
        COUNT_RESET(cnt, (int)BLOCK_Z * hkv + h);
      }
    }
  }
"""


PARTIAL_COMBINE = _partial_combine(COMBINE_ROWS, False)

PARTIAL_TC_BODY = PARTIAL_SETUP + TC_LOOP + PARTIAL_OUTPUT + _partial_combine(COMBINE_ROWS_STRIDED, True)  # CUDA
PARTIAL_BODY = PARTIAL_BODY + PARTIAL_COMBINE
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
#define VQ_BARRIER() __syncthreads()
#define VQ_UNROLL _Pragma("unroll")
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define SHFL_IDX(v, i) __shfl_sync(0xffffffffu, (v), (i))
#define THREADFENCE() __threadfence()
#define ATOMIC_ADD(p, i) atomicAdd(const_cast<int*>(p) + (i), 1)
#define COUNT_RESET(p, i) (const_cast<int*>(p)[(i)] = 0)
#define WARP_SYNC() __syncwarp()
"""
CUDA_HEADER = """
#define DEVICE
#define TGMEM
#define THREAD
#define NEG_INF (-__int_as_float(0x7f800000))
__device__ inline float vq_max(float a, float b) { return fmaxf(a, b); }
__device__ inline int vq_min(int a, int b) { return a < b ? a : b; }
// ex2.approx.ftz: one MUFU instruction (exp2f adds a denormal range fix per call); within 2 ulp, results
// below 2^-126 flushed to 0 (weights that small are below any attention budget: conformance ATTN_SAFETY)
__device__ inline float vq_exp2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
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
#define VQ_BARRIER() threadgroup_barrier(metal::mem_flags::mem_threadgroup)
#define SHFL_XOR(v, m) metal::simd_shuffle_xor((v), (ushort)(m))
#define SHFL_IDX(v, i) metal::simd_shuffle((v), (ushort)(i))
#define THREADFENCE() threadgroup_barrier(metal::mem_flags::mem_device)
#define ATOMIC_ADD(p, i) metal::atomic_fetch_add_explicit((device metal::atomic_int*)(const_cast<device int*>(p) + (i)), 1, metal::memory_order_relaxed)
#define COUNT_RESET(p, i) (const_cast<device int*>(p)[(i)] = 0)
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


def assemble(kind: str, backend: str, mk: int = 0, mv: int = 0, haswin: bool = False,
             fused: bool = False, tc: bool = False, append: bool = False, starts: bool = False) -> tuple[str, str]:
    """(header, source) of kernel `kind` ("partial" | "combine") for `backend` ("cuda" | "metal") and the
    launch's inputs (`inputs(kind, mk, mv, haswin, fused, append)`); `tc`: the partial's tensor-core loop (CUDA);
    `append`: the decode step's append inside (APPEND, append_block); for the combine: it also takes a chunk's
    token (an APPEND partial's or the append kernel's) and writes its summary (COMBINE_SUMMARY)."""
    header, prelude = PRELUDES[backend]
    if tc and (backend != "cuda" or kind != "partial"):
        raise ValueError("the tensor-core loop is a CUDA partial kernel's")
    if append and (fused or haswin):
        raise ValueError("the append runs inside an unfused partial launch without a window")
    pre = ""
    if append and kind == "partial":
        eh, em = encode_macros(backend)
        header, pre = header + eh, em + append_block(mk, mv)
    body = PARTIAL_TC_BODY if tc else BODIES[kind]
    if kind == "combine" and append:
        body = COMBINE_SUMMARY + body
    return (header + (TC_CUDA_HEADER if tc else ""),
            prelude + pre + aliases(kind, mk, mv, haswin, fused, append, starts) + body)
