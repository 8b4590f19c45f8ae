// The encode kernel's body (accelerated/kernels/source.py has the conventions: lanes, macros, template
// constants M, D, TS), shared by CUDA and Metal after a prelude (<backend>_prelude, <backend>_encode_ops).
// Needs VQ_H12 .. VQ_H28 (H_m's rows, spec/formats.toml: the loader defines them); VQ_ENCODE_ARRAYS, its threadgroup
// arrays: encode_arrays.h in the encode kernel, encode_arrays_scoped.h in a scope of a bigger kernel; VQ_CHECK_COUNT and
// VQ_CHECK_ROW, its check-only tokens: check_count.h and check_row.h (x's tokens from..nt-1), or check_count_window.h
// and check_row_window.h (a scope's chunk, copied into its exact window: kernels/append.py with a window).
#include "common.h"
#define VQ_HM12 VQ_H12
#define VQ_HM20 VQ_H20
#define VQ_HM28 VQ_H28
#include "hadamard.h"
// KIVI keys' output rows: their scale / zero rows (a group of gs tokens each) and their codes rows (one per token);
// an encode scope maps them into the streams' buffers (encode_scope.h)
#ifndef VQ_GROW
#define VQ_GROW(bh, ne, i) VQ_OROW(bh, ne, i)
#endif
#ifndef VQ_TROW
#define VQ_TROW(bh, nq, t) ((bh) * (nq) + (t))
#endif

#include VQ_ENCODE_ARRAYS
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
#include VQ_CHECK_COUNT
  const int rows = nb * nh * per;
  bool bad_x = false;
  bool bad_rule = false;
#define VQ_ROWS_PER per
#define VQ_ROWS_N rows
#include "rows.h"

    const int64_t xrow = (int64_t)b * xs0 + (int64_t)h * xs1;
    // row of the outputs (kernels/append.py: of the buffers); KIVI keys' rows i are groups, their scale and zero
    // rows (VQ_GROW), their codes one row per token (VQ_TROW)
    const int orow = (M == 4 && keys != 0) ? VQ_GROW(bh, ne, i) : VQ_OROW(bh, ne, i);
    if (i >= ne) {
      // a token that is only checked (window tokens of a one-shot encode, a chunk's unflushed tokens)
#include VQ_CHECK_ROW

    } else {
    if (M <= 3) {
      // rotation family. 1. exact upcast; 2. n = sqrt(fold(x * x))
#define VQ_X_TOKEN i
#include "load_x.h"

      float f_q[E];
      for (int e = 0; e < E; ++e) {
        f_q[e] = PIN(MUL(f_x[e], f_x[e]));
      }
#define f_FOLD_IN f_q
#define f_FOLD_OUT f_ss
#include "fold.h"

      const float f_n = SQRT(f_ss);
      bad_rule = bad_rule || f_n > f_fmax;      // +Inf: norm overflows binary32
      // 3. r = 1 / n or 0
      const float f_r = (f_n > 0.0f) ? DIV(1.0f, f_n) : 0.0f;
      // 4. y = RHT(x): sign flip, butterfly, scale
      float f_v[E];
#define VQ_FLIP_BITS sgb
#define f_FLIP_SRC f_x
#define f_FLIP_DST f_v
#include "flip.h"
#define f_BF_ARR f_v
#include "butterfly.h"

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
#define f_FOLD_IN f_a
#define f_FOLD_OUT f_as
#include "fold.h"

        if (lane == 0) {
          f_s2[orow] = TO_TS(MUL(MUL(f_as, f_sd), f_r));
        }
      } else {
        // 5. u = y * r; 6. i = quantize(u; B1_d)  (prod: the (bits-1)-bit table is c1/b1)
        float f_e[E];
        for (int e = 0; e < E; ++e) {
          const float f_u = PIN(MUL(f_v[e], f_r));
#define f_Q_VAL f_u
#define f_Q_TABLE f_tq
#define VQ_Q_BITS bits
#define VQ_Q_OUT ci
#define VQ_Q_BASE 0
#include "quantize.h"

          c1[e] = ci;
          f_e[e] = SUB(f_u, f_c1[ci]);          // rvq / prod: the residual e = u - C1[i]
          c2[e] = 0u;
          if (M == 1) {
#define f_Q_VAL f_e[e]
#define f_Q_TABLE f_tq
#define VQ_Q_BITS bits2
#define VQ_Q_OUT ck
#define VQ_Q_BASE 16
#include "quantize.h"

            c2[e] = ck;
          }
        }
        if (M == 3) {
          // prod: gamma = sqrt(fold(e * e)); w = RHT(e) with tau; q = w < 0
          float f_g[E];
          for (int e = 0; e < E; ++e) {
            f_g[e] = PIN(MUL(f_e[e], f_e[e]));
          }
#define f_FOLD_IN f_g
#define f_FOLD_OUT f_gs
#include "fold.h"

          if (lane == 0) {
            f_s2[orow] = TO_TS(SQRT(f_gs));
          }
          float f_w[E];
#define VQ_FLIP_BITS tab
#define f_FLIP_SRC f_e
#define f_FLIP_DST f_w
#include "flip.h"
#define f_BF_ARR f_w
#include "butterfly.h"

          for (int e = 0; e < E; ++e) {
            c2[e] = MUL(f_w[e], f_sd) < 0.0f ? 1u : 0u;
          }
        }
      }
#define VQ_PACK_CODES c1
#define VQ_PACK_BITS bits
#define VQ_PACK_OUT codes1
#define VQ_PACK_ROW orow
#define VQ_PACK_REGION 0
#include "pack.h"

      if (M == 1 || M == 3) {
#define VQ_PACK_CODES c2
#define VQ_PACK_BITS bits2
#define VQ_PACK_OUT codes2
#define VQ_PACK_ROW orow
#define VQ_PACK_REGION 1
#include "pack.h"

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
#define VQ_X_TOKEN i * gs + tt
#include "load_x.h"

        for (int e = 0; e < E; ++e) {
          f_lo[e] = tt == 0 ? f_x[e] : MINF(f_lo[e], f_x[e]);
          f_hi[e] = tt == 0 ? f_x[e] : MAXF(f_hi[e], f_x[e]);
        }
      }
      float f_sc[E];
      float f_zc[E];
      for (int e = 0; e < E; ++e) {
#define f_KP_LO f_lo[e]
#define f_KP_HI f_hi[e]
#define VQ_KP_S16 s16
#define VQ_KP_Z16 z16
#define f_KP_S f_s
#define f_KP_Z f_z
#include "kivi_params.h"

        f_sc[e] = f_s;
        f_zc[e] = f_z;
        if (act) {
          f_s1[(int64_t)orow * D + lane + LW * e] = s16;
          f_s2[(int64_t)orow * D + lane + LW * e] = z16;
        }
      }
      for (int tt = 0; tt < gs; ++tt) {
#define VQ_X_TOKEN i * gs + tt
#include "load_x.h"

        uint32_t c1[E];
        for (int e = 0; e < E; ++e) {
#define f_KC_VAL f_x[e]
#define f_KC_S f_sc[e]
#define f_KC_Z f_zc[e]
#define VQ_KC_OUT cq
#include "kivi_code.h"

          c1[e] = cq;
        }
#define VQ_PACK_CODES c1
#define VQ_PACK_BITS bits
#define VQ_PACK_OUT codes1
#define VQ_PACK_ROW VQ_TROW(bh, nq, i * gs + tt)
#define VQ_PACK_REGION 0
#include "pack.h"

      }
    }
    if ((M == 4 && keys == 0) || M == 5) {
      // kivi values / mlx_affine: groups of gs consecutive channels of one token
#define VQ_X_TOKEN i
#include "load_x.h"
#include "group_minmax.h"

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
#define f_KP_LO f_lo[e]
#define f_KP_HI f_hi[e]
#define VQ_KP_S16 s16
#define VQ_KP_Z16 z16
#define f_KP_S f_s
#define f_KP_Z f_z
#include "kivi_params.h"
#define f_KC_VAL f_x[e]
#define f_KC_S f_s
#define f_KC_Z f_z
#define VQ_KC_OUT cq
#include "kivi_code.h"

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
#define VQ_PACK_CODES c1
#define VQ_PACK_BITS bits
#define VQ_PACK_OUT codes1
#define VQ_PACK_ROW orow
#define VQ_PACK_REGION 0
#include "pack.h"

    }
    }
#include "rows_end.h"

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
