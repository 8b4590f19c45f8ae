"""Kernel source text: one body per kernel, shared by CUDA and Metal, plus a thin prelude per backend
(spec/number-model.md, rotation.md, codebooks.md, packing.md, methods/*.md, streaming.md).

Shape of the bodies: one SIMD group (a CUDA warp, a Metal simdgroup: 32 lanes) per row, where a row is one
token (a KIVI key row: one group of G tokens); several warps per threadgroup; each warp takes a contiguous
chunk of rows (its head's sign bits stay cached in two registers).
Head dim d = RM * NB (rotation.md: m = RM in 1, 12, 20, 28, block length n = NB a power of two). Lane l
holds coordinates j = l + LW*e, e = 0..E-1 (LW = min(NB, 32), E = d / LW), in registers, so block k of the
spec is slots k*EN .. k*EN + EN - 1 of every lane (EN = NB / LW) and position i of a block sits in the same
lane and slot offset in every block. For a power of two d (RM = 1) this is LW = min(d, 32), E = d / LW. So:
- the fold (number-model.md) first adds the blocks left to right inside each lane (block fold, RM > 1),
  then does the halving strides >= LW inside each lane (slot e += slot e + s) and the last strides
  LW/2..1 with shuffle-down, exactly the spec's tree;
- stage A of H (rotation.md, ascending stages on each block) does h = 1..LW/2 across lanes (xor shuffles:
  the lane with bit h clear computes lo + hi, its partner lo - hi) and h >= LW inside each lane; stage B
  (RM > 1) is all inside each lane: output block j = +-block 0 +- ... +- block RM-1 from +0, left to
  right, the signs from row j of H_m (encode) or H_m^T (decode) of spec/formats.toml, compiled in;
- with RM > 1 and NB < 32 only NB of the 32 lanes hold coordinates (d = 80: 4 lanes, 20 slots each);
- quantize counts strict crossings by binary search over the sorted boundaries (the count of B_k < u, the
  same number as the spec's linear count for any u; methods.py checks the tables are sorted);
- packing: 1-bit codes by ballot, 2/4/8-bit codes by an OR over aligned lane groups, 3/5/6/7-bit codes
  staged through per-warp threadgroup memory (codes never straddle words, packing.md); where a slot's LW
  codes are not whole words (RM > 1 with NB < 32: d = 80 has 4 lanes) the other widths are staged too.
No threadgroup barrier runs per row; the only one is at the end of encode, where each threadgroup ORs its
warps' fault flags into one slot of the `fault` output (no atomics, no host sync: methods.py hands the
flags to accelerated.ops.numerics.fault).

Macros each prelude defines (the bodies use nothing else that is backend-specific):
- position: LANE, WARP (simdgroup in the threadgroup), NWARPS, GROUP (threadgroup in the grid, x),
  NGROUPS; the older TID, TOKEN, HEAD, BATCH, NTOK, NHEAD stay defined for other kernels;
- memory and sync: SHARED(type, name, n), BARRIER() (threadgroup), WARP_SYNC() (simdgroup);
- cross-lane: SHFL_XOR(v, m), SHFL_DOWN(v, s), SHFL(v, lane), ANY(p), BALLOT(p) (32-bit lane mask);
- exact float arithmetic: ADD SUB MUL DIV SQRT (one binary32 op, RNE, never contracted), NEG ABS (sign
  bit), FLIP(v, m) (XOR of the sign bit with m = 0 or 0x80000000: v or -v exactly), MINF MAXF (exact),
  TO_F32 (exact upcast), TO_TS (RNE to the stored side-information type TS),
  PIN(v) (an inexact product that feeds an add or subtract in the same lane: a no-op on CUDA, whose _rn
  intrinsics are never fused; an opaque integer round trip on Metal, so no compiler can contract it).
Float variables and float arrays are named `f_*` so a lint can check that every float operation goes
through a helper (tests/test_kernels_source.py); literals end in `f`.

Template constants (set per launch by methods.py): M (method id), D (head dim), TS (dtype of f_s1/f_s2).
"""
from __future__ import annotations

from veloxquant import spec

# Method ids (the kernels' template argument M).
METHOD_IDS = {"turboquant": 0, "turboquant_rvq": 1, "rabitq": 2, "turboquant_prod": 3, "kivi": 4,
              "mlx_affine": 5}

ENCODE_INPUTS = ["x", "sig", "tau", "f_c1", "f_b1", "f_c2", "f_b2", "f_k", "meta"]
ENCODE_OUTPUTS = ["codes1", "codes2", "f_s1", "f_s2", "fault"]
DECODE_INPUTS = ["codes1", "codes2", "f_s1", "f_s2", "sig", "tau", "f_c1", "f_c2", "f_k", "meta"]
DECODE_OUTPUTS = ["f_out"]

# f_k = [s_d, A_d, 2^23, 0x1.8p23 (rint magic), EPS (mlx_affine), L = 2^bits - 1, FLT_MAX, 0]
# meta = [0 (PIN's opaque zero), bits, bits2, G, role is keys (0/1), Q (tokens to encode), first token
#         to check for NaN/Inf, 0]
K_SD, K_AD, K_TWO23, K_MAGIC, K_EPS, K_LEVELS, K_FMAX = range(7)
N_CONSTS = 8
N_META = 8
SMEM_CODES = 8192        # bytes of per-warp code staging in a threadgroup: warps * 2 * D <= this
MAX_WARPS = 32

# ---- shared fragments (plain text, so each body stays one source) ---------------------------------------
_COMMON = """
  constexpr int RM = D % 7 == 0 ? 28 : D % 5 == 0 ? 20 : D % 3 == 0 ? 12 : 1;   // m of d = m * 2^k
  constexpr int NB = D / RM;                    // n: the block length, a power of two
  constexpr int LW = NB < 32 ? NB : 32;         // lanes holding coordinates
  constexpr int E = D / LW;                     // coordinates per lane: j = lane + LW * e
  constexpr int EN = NB / LW;                   // slots per block: block k is slots k*EN .. k*EN+EN-1
  constexpr bool WHOLE = LW == 32 || LW == D;   // a slot's LW 1-bit codes are one whole packing word
  constexpr int WS = (D + 31) / 32;             // sign words per head
  const int lane = (int)LANE;
  const int warp = (int)WARP;
  const int nwarps = (int)NWARPS;
  const bool act = lane < LW;
  const uint32_t pin0 = (uint32_t)meta[0];
  const int bits = meta[1];
  const int bits2 = meta[2];
  const int gs = meta[3];
  const int keys = meta[4];
  const float f_sd = f_k[0];
"""


def _fold(arr: str, out: str) -> str:
    """out = fold(arr[0..D-1]) (block fold, then halving fold), the same value in every lane; arr is
    clobbered."""
    return f"""
    for (int k = 1; k < RM; ++k) {{              // block fold (RM > 1): blocks added left to right
      for (int e = 0; e < EN; ++e) {{
        {arr}[e] = ADD({arr}[e], {arr}[k * EN + e]);
      }}
    }}
    for (int s = EN >> 1; s > 0; s >>= 1) {{
      for (int e = 0; e < s; ++e) {{
        {arr}[e] = ADD({arr}[e], {arr}[e + s]);
      }}
    }}
    float {out} = {arr}[0];
    for (int s = LW >> 1; s > 0; s >>= 1) {{
      const float f_dn = SHFL_DOWN({out}, s);
      {out} = ADD({out}, f_dn);
    }}
    {out} = SHFL({out}, 0);
"""


def _butterfly(arr: str) -> str:
    """H over arr (rotation.md; H_m^T in stage B of decode): stage A, h = 1, 2, ..., NB/2 in ascending order
    on each block, then stage B (RM > 1)."""
    return f"""
    for (int hh = 1; hh < LW; hh <<= 1) {{
      // lane with bit h clear: lo + hi (its own + the partner's); set: lo - hi = lo + (-hi), exactly
      const uint32_t hm = (lane & hh) != 0 ? 0x80000000u : 0u;
      for (int e = 0; e < E; ++e) {{
        const float f_o = SHFL_XOR({arr}[e], hh);
        {arr}[e] = ADD(f_o, FLIP({arr}[e], hm));
      }}
    }}
    for (int hs = 1; hs < EN; hs <<= 1) {{     // inside each block: e and e + hs share a block
      for (int e = 0; e < E; ++e) {{
        if ((e & hs) == 0) {{
          const float f_lo = {arr}[e];
          const float f_hi = {arr}[e + hs];
          {arr}[e] = ADD(f_lo, f_hi);
          {arr}[e + hs] = SUB(f_lo, f_hi);
        }}
      }}
    }}
    if (RM > 1) {{
      // stage B: at each position (slot offset ei of every block), out block j = sum over k of
      // +-block k, left to right from +0, the sign from bit k of row j (every block read before any write).
      // Unrolled (compilers stop short at 20 or 28), so the signs are constants and f_sb stays in registers.
      #pragma unroll
      for (int ei = 0; ei < EN; ++ei) {{
        float f_sb[RM];
        #pragma unroll
        for (int jj = 0; jj < RM; ++jj) {{
          const uint32_t hrow = RM == 12 ? hm12[jj] : RM == 20 ? hm20[jj] : hm28[jj];
          float f_acc = 0.0f;
          #pragma unroll
          for (int k = 0; k < RM; ++k) {{
            const float f_bk = {arr}[k * EN + ei];
            f_acc = ((hrow >> k) & 1u) != 0u ? SUB(f_acc, f_bk) : ADD(f_acc, f_bk);
          }}
          f_sb[jj] = f_acc;
        }}
        #pragma unroll
        for (int jj = 0; jj < RM; ++jj) {{
          {arr}[jj * EN + ei] = f_sb[jj];
        }}
      }}
    }}
"""


def _hadamard_rows(transpose: bool) -> str:
    """H_m of spec/formats.toml (H_m^T if transpose) for m = 12, 20, 28 as constant row masks hm<m>[j]: bit k
    set where entry (j, k) is -1. Compiled into the body, so stage B's signs are constants after unrolling."""
    text = ""
    for m in (12, 20, 28):
        hm = spec.hadamard_matrix(m)
        if transpose:
            hm = hm.T
        words = [sum(1 << k for k in range(m) if hm[j, k] < 0) for j in range(m)]
        text += f"  const uint32_t hm{m}[{m}] = {{" + ", ".join(f"0x{w:07x}u" for w in words) + "};\n"
    return text


def _flip(lanebits: str, src: str, dst: str) -> str:
    """dst[e] = src[e] * sigma_j (exact: a sign flip where bit e of the lane's cached sign bits is set)."""
    return f"""
    for (int e = 0; e < E; ++e) {{
      const uint32_t fm = ({lanebits} << (31 - e)) & 0x80000000u;
      {dst}[e] = FLIP({src}[e], fm);
    }}
"""


_SIGNS = """
      if (h != hsig) {                          // a new head: cache this lane's sign bits (bit e: slot e)
        hsig = h;
        sgb = 0u;
        tab = 0u;
        for (int e = 0; e < E; ++e) {
          const int j = lane + LW * e;
          sgb |= ((sig[h * WS + (j >> 5)] >> (j & 31)) & 1u) << e;
          if (M == 3) {
            tab |= ((tau[h * WS + (j >> 5)] >> (j & 31)) & 1u) << e;
          }
        }
      }
"""


def _rows(per: str, rows: str) -> str:
    """Loop over this warp's rows: rows r = (b * nh + h) * per + i are split into one contiguous chunk per
    warp (a warp's rows mostly share a head: its sign bits stay cached), with (i, h, b) advanced
    incrementally (no division per row). The loop body ends with _ROWS_END."""
    return f"""
  const uint32_t uper = ({per}) > 0 ? (uint32_t)({per}) : 1u;   // no division by 0 when there are no rows
  const uint32_t unh = nh > 0 ? (uint32_t)nh : 1u;
  const uint32_t nrows = (uint32_t)({rows});
  const uint32_t nwall = (uint32_t)NGROUPS * (uint32_t)nwarps;
  const uint32_t chunk = (nrows + nwall - 1u) / nwall;
  const uint32_t rbeg = ((uint32_t)GROUP * (uint32_t)nwarps + (uint32_t)warp) * chunk;
  const uint32_t rend = rbeg + chunk < nrows ? rbeg + chunk : nrows;
  uint32_t ui = rbeg % uper;
  uint32_t ubh = rbeg / uper;
  uint32_t uh = ubh % unh;
  uint32_t ub = ubh / unh;
  int hsig = -1;                                // the head whose sign bits sgb (sigma), tab (tau) hold
  uint32_t sgb = 0u;
  uint32_t tab = 0u;
  for (uint32_t r = rbeg; r < rend; ++r) {{
    const int i = (int)ui;
    const int h = (int)uh;
    const int bh = (int)ubh;
    const int b = (int)ub;
"""


_ROWS_END = """
    ui += 1u;                                   // the next row: (i, h, b) with carries
    if (ui == uper) {
      ui = 0u;
      ubh += 1u;
      uh += 1u;
      if (uh == unh) {
        uh = 0u;
        ub += 1u;
      }
    }
  }
"""


def _quantize(val: str, table: str, nbits: str, out: str) -> str:
    """out = number of boundaries strictly below val (sorted table of 2^nbits - 1 entries)."""
    return f"""
      uint32_t {out} = 0u;
      {{
        int s = 1 << ({nbits} - 1);
        for (int st = 0; st < 4; ++st) {{        // nbits <= 4: a fixed trip count, unrolled
          if (s > 0 && {val} > {table}[{out} + s - 1]) {{
            {out} += (uint32_t)s;
          }}
          s >>= 1;
        }}
      }}
"""


def _pack(codes: str, nbits: str, out: str, orow: str, region: str) -> str:
    """Row orow of `out` = pack(codes[0..D-1], nbits) (packing.md); codes[e] belongs to j = lane + LW*e."""
    return f"""
    {{
      const int kk = 32 / {nbits};
      const int nw = (D + kk - 1) / kk;
      const int64_t ob = (int64_t)({orow}) * nw;
      if (WHOLE && {nbits} == 1) {{
        for (int e = 0; e < E; ++e) {{
          const uint32_t wv = BALLOT(act && {codes}[e] != 0u);
          if (lane == 0) {{
            {out}[ob + e] = LW == 32 ? wv : (wv & ((1u << LW) - 1u));
          }}
        }}
      }} else if ((kk & (kk - 1)) == 0 && (WHOLE || LW % kk == 0)) {{
        // k = 16, 8, 4 codes per word: an aligned group of k lanes fills one word of one slot
        for (int e = 0; e < E; ++e) {{
          uint32_t wv = {codes}[e] << ({nbits} * (lane & (kk - 1)));
          for (int s = 8; s > 0; s >>= 1) {{         // fixed trip count; the guard is warp-uniform
            if (s < kk) {{
              wv |= SHFL_XOR(wv, s);
            }}
          }}
          if (act && (lane & (kk - 1)) == 0) {{
            {out}[ob + (lane + LW * e) / kk] = wv;
          }}
        }}
      }} else {{
        // 3, 5, 6, 7 bits (and 1, 2, 4, 8 bits where a slot's LW codes are not whole words: d = 80 has
        // LW = 4): words span lanes unevenly; stage the codes in this warp's region
        const int base = (warp * 2 + {region}) * D;
        WARP_SYNC();
        for (int e = 0; e < E; ++e) {{
          if (act) {{
            cst[base + lane + LW * e] = (uint8_t){codes}[e];
          }}
        }}
        WARP_SYNC();
        for (int w = lane; w < nw; w += 32) {{
          uint32_t wv = 0u;
          for (int s = 0; s < kk; ++s) {{
            const int jj = w * kk + s;
            if (jj < D) {{
              wv |= ((uint32_t)cst[base + jj]) << ({nbits} * s);
            }}
          }}
          {out}[ob + w] = wv;
        }}
      }}
    }}
"""


def _unpack(words: str, nbits: str, irow: str, out: str) -> str:
    """out[e] = code j = lane + LW*e of row irow: (word[j div k] >> (b * (j mod k))) & (2^b - 1)."""
    return f"""
    uint32_t {out}[E];
    {{
      const int kk = 32 / {nbits};
      const int nw = (D + kk - 1) / kk;
      const int64_t ib = (int64_t)({irow}) * nw;
      const int qw = LW / kk;
      const int rw = LW % kk;
      int wi = lane / kk;
      int ws = lane % kk;
      for (int e = 0; e < E; ++e) {{
        {out}[e] = act ? ({words}[ib + wi] >> ({nbits} * ws)) & ((1u << {nbits}) - 1u) : 0u;
        wi += qw;
        ws += rw;
        if (ws >= kk) {{
          ws -= kk;
          wi += 1;
        }}
      }}
    }}
"""


def _load_x(tok: str) -> str:
    """f_x[e] = exact upcast of x[b, h, tok, lane + LW*e] (read through x's strides); NaN/Inf noted."""
    return f"""
    float f_x[E];
    for (int e = 0; e < E; ++e) {{
      f_x[e] = 0.0f;
      if (act) {{
        f_x[e] = TO_F32(x[xrow + (int64_t)({tok}) * xs2 + (int64_t)(lane + LW * e) * xs3]);
      }}
      bad_x = bad_x || !(ABS(f_x[e]) <= f_fmax);
    }}
"""


def _group_minmax() -> str:
    """f_lo[e], f_hi[e] = min and max over the KIVI / mlx_affine channel group holding slot e (groups of
    gs consecutive coordinates: gs / LW whole slots, or aligned groups of gs lanes when gs < LW)."""
    return """
    const int gsl = gs > LW ? gs / LW : 1;      // slots per group
    const int gl = gs < LW ? gs : LW;           // lanes per group
    float f_lo[E];
    float f_hi[E];
    for (int e = 0; e < E; ++e) {
      f_lo[e] = f_x[e];
      f_hi[e] = f_x[e];
    }
    for (int e = 1; e < E; ++e) {
      if (e % gsl != 0) {
        f_lo[e] = MINF(f_lo[e - 1], f_lo[e]);
        f_hi[e] = MAXF(f_hi[e - 1], f_hi[e]);
      }
    }
    for (int e = E - 2; e >= 0; --e) {
      if ((e + 1) % gsl != 0) {
        f_lo[e] = f_lo[e + 1];
        f_hi[e] = f_hi[e + 1];
      }
    }
    for (int s = gl >> 1; s > 0; s >>= 1) {
      for (int e = 0; e < E; ++e) {
        const float f_ol = SHFL_XOR(f_lo[e], s);
        const float f_oh = SHFL_XOR(f_hi[e], s);
        f_lo[e] = MINF(f_lo[e], f_ol);
        f_hi[e] = MAXF(f_hi[e], f_oh);
      }
    }
"""


def _kivi_params(lo: str, hi: str, s16: str, z16: str, fs: str, fz: str) -> str:
    """KIVI steps 1-4 of one group from its min/max (spec/methods/kivi.md)."""
    return f"""
      const float f_m = ADD({lo}, 0.0f);
      const float f_mx = ADD({hi}, 0.0f);
      const TS {s16} = TO_TS(DIV(SUB(f_mx, f_m), f_lev));
      const TS {z16} = TO_TS(f_m);
      const float {fs} = TO_F32({s16});
      const float {fz} = TO_F32({z16});
      bad_rule = bad_rule || !(ABS({fs}) <= f_fmax) || !(ABS({fz}) <= f_fmax);
"""


def _kivi_code(val: str, fs: str, fz: str, out: str) -> str:
    """KIVI step 5: c = 0 if S = 0, else rint(min(max((v - Z) / S, 0), L))."""
    return f"""
      uint32_t {out} = 0u;
      if ({fs} != 0.0f) {{
        const float f_y = MINF(MAXF(DIV(SUB({val}, {fz}), {fs}), 0.0f), f_lev);
        {out} = (uint32_t)SUB(ADD(f_y, f_magic), f_magic);
      }}
"""


ENCODE_BODY = (
    _COMMON
    + _hadamard_rows(False)
    + """
  SHARED(uint8_t, cst, 8192);                    // per-warp code staging (3/5/6/7-bit packing)
  SHARED(uint32_t, flt, 64);                     // per-warp fault flags
  const int nq = meta[5];                       // tokens to encode: 0..nq-1
  const int lo = meta[6];                       // tokens lo..T-1 are checked for NaN/Inf too
  const float f_lev = f_k[5];
  const float f_magic = f_k[3];
  const float f_fmax = f_k[6];
  const int nb = x_shape[0];
  const int nh = x_shape[1];
  const int nt = x_shape[2];
  const int64_t xs0 = x_strides[0];
  const int64_t xs1 = x_strides[1];
  const int64_t xs2 = x_strides[2];
  const int64_t xs3 = x_strides[3];
  const int from = nq > lo ? nq : lo;           // first check-only token
  const int ne = (M == 4 && keys != 0) ? nq / gs : nq;   // encode rows per (b, h)
  const int per = ne + (nt - from);
  const int rows = nb * nh * per;
  bool bad_x = false;
  bool bad_rule = false;
"""
    + _rows("per", "rows")
    + """
    const int64_t xrow = (int64_t)b * xs0 + (int64_t)h * xs1;
    const int orow = VQ_OROW(bh, ne, i);        // row of the outputs (kernels/append.py: of the buffers)
    if (i >= ne) {
      // a token that is only checked (window tokens of a one-shot encode, a chunk's unflushed tokens)
"""
    + _load_x("from + (i - ne)")
    + """
    } else {
    if (M <= 3) {
      // rotation family. 1. exact upcast; 2. n = sqrt(fold(x * x))
"""
    + _SIGNS
    + _load_x("i")
    + """
      float f_q[E];
      for (int e = 0; e < E; ++e) {
        f_q[e] = PIN(MUL(f_x[e], f_x[e]));
      }
"""
    + _fold("f_q", "f_ss")
    + """
      const float f_n = SQRT(f_ss);
      bad_rule = bad_rule || f_n > f_fmax;      // +Inf: norm overflows binary32
      // 3. r = 1 / n or 0
      const float f_r = (f_n > 0.0f) ? DIV(1.0f, f_n) : 0.0f;
      // 4. y = RHT(x): sign flip, butterfly, scale
      float f_v[E];
"""
    + _flip("sgb", "f_x", "f_v")
    + _butterfly("f_v")
    + """
      for (int e = 0; e < E; ++e) {
        f_v[e] = MUL(f_v[e], f_sd);
      }
      if (lane == 0) {
        f_s1[orow] = TO_TS(f_n);
      }
      uint32_t c1[E];
      uint32_t c2[E];
      if (M == 2) {
        // rabitq: a = fold(|y|); ip = (a * s_d) * r; q = y < 0
        float f_a[E];
        for (int e = 0; e < E; ++e) {
          f_a[e] = ABS(f_v[e]);
          c1[e] = f_v[e] < 0.0f ? 1u : 0u;
        }
"""
    + _fold("f_a", "f_as")
    + """
        if (lane == 0) {
          f_s2[orow] = TO_TS(MUL(MUL(f_as, f_sd), f_r));
        }
      } else {
        // 5. u = y * r; 6. i = quantize(u; B1_d)  (prod: the (bits-1)-bit table is c1/b1)
        float f_e[E];
        for (int e = 0; e < E; ++e) {
          const float f_u = PIN(MUL(f_v[e], f_r));
"""
    + _quantize("f_u", "f_b1", "bits", "ci")
    + """
          c1[e] = ci;
          f_e[e] = SUB(f_u, f_c1[ci]);          // rvq / prod: the residual e = u - C1[i]
          c2[e] = 0u;
          if (M == 1) {
"""
    + _quantize("f_e[e]", "f_b2", "bits2", "ck")
    + """
            c2[e] = ck;
          }
        }
        if (M == 3) {
          // prod: gamma = sqrt(fold(e * e)); w = RHT(e) with tau; q = w < 0
          float f_g[E];
          for (int e = 0; e < E; ++e) {
            f_g[e] = PIN(MUL(f_e[e], f_e[e]));
          }
"""
    + _fold("f_g", "f_gs")
    + """
          if (lane == 0) {
            f_s2[orow] = TO_TS(SQRT(f_gs));
          }
          float f_w[E];
"""
    + _flip("tab", "f_e", "f_w")
    + _butterfly("f_w")
    + """
          for (int e = 0; e < E; ++e) {
            c2[e] = MUL(f_w[e], f_sd) < 0.0f ? 1u : 0u;
          }
        }
      }
"""
    + _pack("c1", "bits", "codes1", "orow", "0")
    + """
      if (M == 1 || M == 3) {
"""
    + _pack("c2", "bits2", "codes2", "orow", "1")
    + """
      }
    }
    if (M == 4 && keys != 0) {
      // kivi keys: row i = group of gs tokens; per channel j: min/max over the group's tokens
      float f_lo[E];
      float f_hi[E];
      for (int e = 0; e < E; ++e) {
        f_lo[e] = 0.0f;
        f_hi[e] = 0.0f;
      }
      for (int tt = 0; tt < gs; ++tt) {
"""
    + _load_x("i * gs + tt")
    + """
        for (int e = 0; e < E; ++e) {
          f_lo[e] = tt == 0 ? f_x[e] : MINF(f_lo[e], f_x[e]);
          f_hi[e] = tt == 0 ? f_x[e] : MAXF(f_hi[e], f_x[e]);
        }
      }
      float f_sc[E];
      float f_zc[E];
      for (int e = 0; e < E; ++e) {
"""
    + _kivi_params("f_lo[e]", "f_hi[e]", "s16", "z16", "f_s", "f_z")
    + """
        f_sc[e] = f_s;
        f_zc[e] = f_z;
        if (act) {
          f_s1[(int64_t)orow * D + lane + LW * e] = s16;
          f_s2[(int64_t)orow * D + lane + LW * e] = z16;
        }
      }
      for (int tt = 0; tt < gs; ++tt) {
"""
    + _load_x("i * gs + tt")
    + """
        uint32_t c1[E];
        for (int e = 0; e < E; ++e) {
"""
    + _kivi_code("f_x[e]", "f_sc[e]", "f_zc[e]", "cq")
    + """
          c1[e] = cq;
        }
"""
    + _pack("c1", "bits", "codes1", "(bh * nq + i * gs + tt)", "0")
    + """
      }
    }
    if ((M == 4 && keys == 0) || M == 5) {
      // kivi values / mlx_affine: groups of gs consecutive channels of one token
"""
    + _load_x("i")
    + _group_minmax()
    + """
      if (M == 5) {
        // mlx_affine steps 2-6 (spec/methods/mlx_affine.md), once per group at its first slot (later slots
        // of the group copy them); f_lo / f_hi then hold the group's bias and scale
        for (int e = 0; e < E; ++e) {
          if (e % gsl == 0) {
            const bool flip = ABS(f_lo[e]) > ABS(f_hi[e]);
            const float f_span = SUB(f_hi[e], f_lo[e]);
            bad_rule = bad_rule || f_span > f_fmax;
            const float f_s0 = MAXF(DIV(f_span, f_lev), f_k[4]);
            const float f_s = flip ? f_s0 : NEG(f_s0);
            const float f_edge = flip ? f_lo[e] : f_hi[e];
            // q0 = rint(edge / s) for any magnitude: |v| >= 2^23 is an integer already
            const float f_t = DIV(f_edge, f_s);
            const float f_ta = ABS(f_t);
            const float f_tr = SUB(ADD(f_ta, f_k[2]), f_k[2]);
            const float f_q0 = f_ta < f_k[2] ? (f_t < 0.0f ? NEG(f_tr) : f_tr) : f_t;
            const bool nz = f_q0 != 0.0f;
            f_hi[e] = nz ? DIV(f_edge, f_q0) : f_s;
            f_lo[e] = nz ? f_edge : 0.0f;
          } else {
            f_hi[e] = f_hi[e > 0 ? e - 1 : 0];
            f_lo[e] = f_lo[e > 0 ? e - 1 : 0];
          }
        }
      }
      uint32_t c1[E];
      for (int e = 0; e < E; ++e) {
        const bool first = (lane % gl) == 0 && (e % gsl) == 0;   // this lane stores group g's fields
        const int64_t g = (int64_t)orow * (D / gs) + (lane + LW * e) / gs;
        if (M == 4) {
"""
    + _kivi_params("f_lo[e]", "f_hi[e]", "s16", "z16", "f_s", "f_z")
    + _kivi_code("f_x[e]", "f_s", "f_z", "cq")
    + """
          c1[e] = cq;
          if (act && first) {
            f_s1[g] = s16;
            f_s2[g] = z16;
          }
        } else {
          // mlx_affine step 7 with the group's scale and bias (steps 2-6 above)
          const float f_beta = f_lo[e];
          const float f_sf = f_hi[e];
          const float f_y = MINF(MAXF(DIV(SUB(f_x[e], f_beta), f_sf), 0.0f), f_lev);
          c1[e] = (uint32_t)SUB(ADD(f_y, f_magic), f_magic);
          if (act && first) {
            f_s1[g] = TO_TS(f_sf);
            f_s2[g] = TO_TS(f_beta);
          }
        }
      }
"""
    + _pack("c1", "bits", "codes1", "orow", "0")
    + """
    }
    }
"""
    + _ROWS_END
    + """
  // fault flags: warp vote, then one slot per threadgroup (every warp gets here: no early return)
  const bool any_x = ANY(bad_x);
  const bool any_rule = ANY(bad_rule);
  if (lane == 0) {
    flt[2 * warp] = any_x ? 1u : 0u;
    flt[2 * warp + 1] = any_rule ? 1u : 0u;
  }
  BARRIER();
  if (lane == 0 && warp == 0) {
    uint32_t fx = 0u;
    uint32_t fr = 0u;
    for (int w = 0; w < nwarps; ++w) {
      fx |= flt[2 * w];
      fr |= flt[2 * w + 1];
    }
    fault[2 * GROUP] = fx != 0u;
    fault[2 * GROUP + 1] = fr != 0u;
  }
"""
)

DECODE_BODY = (
    _COMMON
    + _hadamard_rows(True)
    + """
  const int nb = codes1_shape[0];
  const int nh = codes1_shape[1];
  const int nq = codes1_shape[2];
  const int rows = nb * nh * nq;
"""
    + _rows("nq", "rows")
    + """
    (void)b;
    (void)i;
"""
    + _unpack("codes1", "bits", "r", "ci")
    + """
    float f_v[E];
    if (M <= 3) {
"""
    + _SIGNS
    + """
      const float f_n = TO_F32(f_s1[r]);
      if (M == 0) {
        // y^ = C_d[i] * n
        for (int e = 0; e < E; ++e) {
          f_v[e] = PIN(MUL(f_c1[ci[e]], f_n));
        }
      }
      if (M == 1) {
        // y^ = (C1_d[i] + C2_d[k]) * n: add, then multiply
"""
    + _unpack("codes2", "bits2", "r", "ck")
    + """
        for (int e = 0; e < E; ++e) {
          f_v[e] = PIN(MUL(ADD(f_c1[ci[e]], f_c2[ck[e]]), f_n));
        }
      }
      if (M == 2) {
        // g = (n * s_d) / ip if ip > 0 else 0; y^ = -g if q = 1 else g
        const float f_ip = TO_F32(f_s2[r]);
        const float f_g = (f_ip > 0.0f) ? DIV(MUL(f_n, f_sd), f_ip) : 0.0f;
        for (int e = 0; e < E; ++e) {
          f_v[e] = (ci[e] == 1u) ? NEG(f_g) : f_g;
        }
      }
      if (M == 3) {
        // s = -1 / +1 from the QJL bit; t = RHT_inverse(s) with tau; e^ = t * (gamma * A_d);
        // u^ = C_d[i] + e^; y^ = u^ * n
"""
    + _unpack("codes2", "1", "r", "cq")
    + """
        float f_s[E];
        for (int e = 0; e < E; ++e) {
          f_s[e] = (cq[e] == 1u) ? NEG(1.0f) : 1.0f;
        }
"""
    + _butterfly("f_s")
    + """
        for (int e = 0; e < E; ++e) {
          f_s[e] = MUL(f_s[e], f_sd);
        }
        float f_t[E];
"""
    + _flip("tab", "f_s", "f_t")
    + """
        const float f_g = MUL(TO_F32(f_s2[r]), f_k[1]);
        for (int e = 0; e < E; ++e) {
          const float f_eh = PIN(MUL(f_t[e], f_g));
          f_v[e] = PIN(MUL(ADD(f_c1[ci[e]], f_eh), f_n));
        }
      }
      // x^ = RHT_inverse(y^): butterfly, scale, sign flip
"""
    + _butterfly("f_v")
    + """
      for (int e = 0; e < E; ++e) {
        f_v[e] = MUL(f_v[e], f_sd);
      }
      float f_o[E];
"""
    + _flip("sgb", "f_v", "f_o")
    + """
      for (int e = 0; e < E; ++e) {
        f_v[e] = f_o[e];
      }
    } else {
      // kivi: x^ = c * S + Z; mlx_affine: x^ = T(T(c * S) + Bi)
      for (int e = 0; e < E; ++e) {
        const int j = lane + LW * e;
        const int64_t g = (M == 4 && keys != 0) ? ((int64_t)bh * (nq / gs) + i / gs) * D + j
                                                : (int64_t)r * (D / gs) + j / gs;
        const float f_sg = act ? TO_F32(f_s1[g]) : 0.0f;
        const float f_zg = act ? TO_F32(f_s2[g]) : 0.0f;
        const float f_p = PIN(MUL(static_cast<float>(ci[e]), f_sg));
        if (M == 4) {
          f_v[e] = ADD(f_p, f_zg);
        } else {
          f_v[e] = TO_F32(TO_TS(ADD(PIN(TO_F32(TO_TS(f_p))), f_zg)));
        }
      }
    }
    for (int e = 0; e < E; ++e) {
      if (act) {
        f_out[(int64_t)r * D + lane + LW * e] = f_v[e];
      }
    }
"""
    + _ROWS_END
)

BODIES = {"encode": ENCODE_BODY, "decode": DECODE_BODY}

# ---- preludes -----------------------------------------------------------------------------------------
# CUDA (NVRTC): the _rn intrinsics are single correctly rounded ops that are never contracted into FMA;
# NVRTC defaults give IEEE division/sqrt and no flush to zero, and the intrinsics pin that down explicitly.
CUDA_HEADER = """
template <typename T> __device__ __forceinline__ T vq_to(float f);
template <> __device__ __forceinline__ float vq_to<float>(float f) { return f; }
template <> __device__ __forceinline__ __half vq_to<__half>(float f) { return __float2half_rn(f); }
template <> __device__ __forceinline__ __nv_bfloat16 vq_to<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}
"""
CUDA_PRELUDE = """
#define TID threadIdx.x
#define TOKEN blockIdx.x
#define HEAD blockIdx.y
#define BATCH blockIdx.z
#define NTOK gridDim.x
#define NHEAD gridDim.y
#define LANE (threadIdx.x & 31u)
#define WARP (threadIdx.x >> 5)
#define NWARPS (blockDim.x >> 5)
#define GROUP blockIdx.x
#define NGROUPS gridDim.x
#define SHARED(type, name, n) __shared__ type name[n]
#define BARRIER() __syncthreads()
#define WARP_SYNC() __syncwarp()
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define SHFL_DOWN(v, s) __shfl_down_sync(0xffffffffu, (v), (s))
#define SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l))
#define ANY(p) (__any_sync(0xffffffffu, (p)) != 0)
#define BALLOT(p) __ballot_sync(0xffffffffu, (p))
#define ADD(a, b) __fadd_rn((a), (b))
#define SUB(a, b) __fsub_rn((a), (b))
#define MUL(a, b) __fmul_rn((a), (b))
#define DIV(a, b) __fdiv_rn((a), (b))
#define SQRT(a) __fsqrt_rn((a))
#define NEG(a) (-(a))
#define ABS(a) fabsf((a))
#define FLIP(v, m) __uint_as_float(__float_as_uint((v)) ^ (m))
#define MINF(a, b) fminf((a), (b))
#define MAXF(a, b) fmaxf((a), (b))
#define PIN(v) (v)
#define TO_F32(v) static_cast<float>(v)
#define TO_TS(v) vq_to<TS>((v))
#define VQ_OROW(bh, ne, i) ((bh) * (ne) + (i))
"""

# Metal: contraction is switched off for the whole translation unit, division and sqrt are the precise::
# variants (correctly rounded), every op is a named inline function, and PIN routes a product through an
# integer XOR with a zero the compiler cannot see. Not run here (no Apple GPU); compiled on Linux against
# a shim of the Metal builtins (tests/test_kernels_source.py).
METAL_HEADER = """
#pragma clang fp contract(off)
inline float vq_add(float a, float b) { return a + b; }
inline float vq_sub(float a, float b) { return a - b; }
inline float vq_mul(float a, float b) { return a * b; }
inline float vq_div(float a, float b) { return metal::precise::divide(a, b); }
inline float vq_sqrt(float a) { return metal::precise::sqrt(a); }
inline float vq_pin(float v, uint z) { return as_type<float>(as_type<uint>(v) ^ z); }
inline uint vq_ballot(bool p) { return (uint)(static_cast<uint64_t>(metal::simd_ballot(p)) & 0xffffffffull); }
"""
METAL_PRELUDE = """
#define TID thread_position_in_threadgroup.x
#define TOKEN threadgroup_position_in_grid.x
#define HEAD threadgroup_position_in_grid.y
#define BATCH threadgroup_position_in_grid.z
#define NTOK threadgroups_per_grid.x
#define NHEAD threadgroups_per_grid.y
#define LANE thread_index_in_simdgroup
#define WARP simdgroup_index_in_threadgroup
#define NWARPS simdgroups_per_threadgroup
#define GROUP threadgroup_position_in_grid.x
#define NGROUPS threadgroups_per_grid.x
#define SHARED(type, name, n) threadgroup type name[n]
#define BARRIER() threadgroup_barrier(metal::mem_flags::mem_threadgroup)
#define WARP_SYNC() metal::simdgroup_barrier(metal::mem_flags::mem_threadgroup)
#define SHFL_XOR(v, m) metal::simd_shuffle_xor((v), (ushort)(m))
#define SHFL_DOWN(v, s) metal::simd_shuffle_down((v), (ushort)(s))
#define SHFL(v, l) metal::simd_shuffle((v), (ushort)(l))
#define ANY(p) metal::simd_any((p))
#define BALLOT(p) vq_ballot((p))
#define ADD(a, b) vq_add((a), (b))
#define SUB(a, b) vq_sub((a), (b))
#define MUL(a, b) vq_mul((a), (b))
#define DIV(a, b) vq_div((a), (b))
#define SQRT(a) vq_sqrt((a))
#define NEG(a) (-(a))
#define ABS(a) metal::abs((a))
#define FLIP(v, m) as_type<float>(as_type<uint>((v)) ^ (m))
#define MINF(a, b) metal::fmin((a), (b))
#define MAXF(a, b) metal::fmax((a), (b))
#define PIN(v) vq_pin((v), pin0)
#define TO_F32(v) static_cast<float>(v)
#define TO_TS(v) static_cast<TS>((v))
#define VQ_OROW(bh, ne, i) ((bh) * (ne) + (i))
"""

PRELUDES = {"cuda": (CUDA_HEADER, CUDA_PRELUDE), "metal": (METAL_HEADER, METAL_PRELUDE)}


def assemble(kind: str, backend: str) -> tuple[str, str]:
    """(header, source) of kernel `kind` ("encode" | "decode") for `backend` ("cuda" | "metal")."""
    header, prelude = PRELUDES[backend]
    return header, prelude + BODIES[kind]
