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
# Warps of one threadgroup at most. A CUDA block gets at most 64K registers and ptxas gives these kernels up to
# 255 per thread (decode at d = 80: 200; at d = 1024: 255), so 8 warps (256 threads, 255 x 256 <= 65536) always
# launch; 32 warps did not at d = 80 / 96 ("too many resources requested for launch" on the H200, and where
# MLX did not report it the output was never written). Metal lowers a pipeline's thread limit with its
# register use too.
MAX_WARPS = 8
REGISTER_FILE = 65536    # 32-bit registers per CUDA block (sm_90)
MAX_REGISTERS = 255      # per thread, the most ptxas assigns

from veloxquant.accelerated.kernels.source_fragments import (  # noqa: F401  (re-exported for tests)
    _COMMON, _ROWS_END, _butterfly, _flip, _fold, _group_minmax, _hadamard_rows, _kivi_code,
    _kivi_params, _load_x, _pack, _quantize, _rows, _unpack)

ENCODE_BODY = (
    _COMMON
    + _hadamard_rows(False)
    + """
  SHARED(uint8_t, cst, 8192);                    // per-warp code staging (3/5/6/7-bit packing)
  SHARED(uint32_t, flt, 64);                     // per-warp fault flags
  // quantize's sorted boundaries (B1 of bits <= 4 bits: 15 at most; rvq's B2) in threadgroup memory: one load
  // per lookup step instead of a global load with 64-bit addressing
  SHARED(float, f_tq, 32);
  if (M <= 3 && M != 2 && warp == 0) {
    const int k = lane & 15;
    const bool two = lane >= 16;
    float f_t = 0.0f;
    if (!two && k < (1 << bits) - 1) {
      f_t = f_b1[k];
    }
    if (two && M == 1 && k < (1 << bits2) - 1) {
      f_t = f_b2[k];
    }
    f_tq[lane] = f_t;
  }
  BARRIER();
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
    + _quantize("f_u", "f_tq", "bits", "ci")
    + """
          c1[e] = ci;
          f_e[e] = SUB(f_u, f_c1[ci]);          // rvq / prod: the residual e = u - C1[i]
          c2[e] = 0u;
          if (M == 1) {
"""
    + _quantize("f_e[e]", "f_tq", "bits2", "ck", 16)
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

from veloxquant.accelerated.kernels.source_preludes import (  # noqa: E402,F401  (re-exported)
    CUDA_HEADER, CUDA_PRELUDE, METAL_HEADER, METAL_PRELUDE, PRELUDES)


def assemble(kind: str, backend: str) -> tuple[str, str]:
    """(header, source) of kernel `kind` ("encode" | "decode") for `backend` ("cuda" | "metal")."""
    header, prelude = PRELUDES[backend]
    return header, prelude + BODIES[kind]
