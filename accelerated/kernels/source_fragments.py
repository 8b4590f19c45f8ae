"""Text fragments of source.py's encode and decode bodies (shared by both, so each body stays one source):
the lane layout, the halving fold, the butterfly and stage B of H, sign flips, the row loop, quantize,
pack/unpack, x loads, group min/max and KIVI's parameters. See source.py for the conventions they follow.
"""
from __future__ import annotations

from veloxquant import spec

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
  // code widths, group size, KIVI role: meta[1..4], or template constants where a launch sets them (VQ_B1 =
  // B1 > 0, ...: the compiler specializes the packing, quantize and group loops; methods.SPECIALIZE_ROWS)
  const int bits = VQ_B1 > 0 ? VQ_B1 : meta[1];
  const int bits2 = VQ_B2 > 0 ? VQ_B2 : meta[2];
  const int gs = VQ_GS > 0 ? VQ_GS : meta[3];
  const int keys = VQ_KR >= 0 ? VQ_KR : meta[4];
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


def _signs(h: str) -> str:
    """This lane's sign bits of head h (bit e: slot e): sgb (sigma), tab (tau, turboquant_prod)."""
    return f"""
    if (M <= 3) {{
      sgb = 0u;
      tab = 0u;
      for (int e = 0; e < E; ++e) {{
        const int j = lane + LW * e;
        sgb |= ((sig[({h}) * WS + (j >> 5)] >> (j & 31)) & 1u) << e;
        if (M == 3) {{
          tab |= ((tau[({h}) * WS + (j >> 5)] >> (j & 31)) & 1u) << e;
        }}
      }}
    }}
"""


def _rows(per: str, rows: str) -> str:
    """Loop over this warp's rows: rows r = (b * nh + h) * per + i are split into one contiguous chunk per
    warp, walked as segments of one (b, h) each: the head's sign bits (sgb, tab) are loaded once per
    segment (not tested in every row), (i, h, b) advance without a division per row. The loop body ends
    with _ROWS_END."""
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
  uint32_t sgb = 0u;                            // sign bits of the segment's head: sigma, tau
  uint32_t tab = 0u;
  for (uint32_t r0 = rbeg; r0 < rend; ) {{
    const uint32_t rs = uper - ui < rend - r0 ? r0 + (uper - ui) : rend;   // this (b, h)'s rows: r0 .. rs-1
    const int h = (int)uh;
    const int bh = (int)ubh;
    const int b = (int)ub;
""" + _signs("h") + """
  for (uint32_t r = r0; r < rs; ++r) {
    const int i = (int)(ui + (r - r0));
"""


_ROWS_END = """
  }
    ui = 0u;                                    // the next segment: (h, b) with carries
    ubh += 1u;
    uh += 1u;
    if (uh == unh) {
      uh = 0u;
      ub += 1u;
    }
    r0 = rs;
  }
"""


def _quantize(val: str, table: str, nbits: str, out: str, base: int = 0) -> str:
    """out = number of boundaries strictly below val (sorted table of 2^nbits - 1 entries from table[base])."""
    return f"""
      uint32_t {out} = 0u;
      {{
        int qa = {base};                          // base + the count so far
        int s = 1 << ({nbits} - 1);
        for (int st = 0; st < 4; ++st) {{        // nbits <= 4: a fixed trip count, unrolled
          if (s > 0 && {val} > {table}[qa + (s - 1)]) {{
            qa += s;
          }}
          s >>= 1;
        }}
        {out} = (uint32_t)(qa - {base});
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
            // (lane + LW * e) / kk, as a row offset plus a constant per slot (kk divides LW here)
            {out}[ob + lane / kk + e * (LW / kk)] = wv;
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
