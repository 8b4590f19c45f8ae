// The decode kernel's body (accelerated/kernels/source.py has the conventions), shared by CUDA and Metal after a
// prelude. Needs VQ_HT12 .. VQ_HT28 (H_m^T's rows: the loader defines them).
#include "common.h"
#define VQ_HM12 VQ_HT12
#define VQ_HM20 VQ_HT20
#define VQ_HM28 VQ_HT28
#include "hadamard.h"

  const int nb = codes1_shape[0];
  const int nh = codes1_shape[1];
  const int nq = codes1_shape[2];
  const int rows = nb * nh * nq;
#define VQ_ROWS_PER nq
#define VQ_ROWS_N rows
#include "rows.h"

    (void)b;
    (void)i;
#define VQ_UNPACK_WORDS codes1
#define VQ_UNPACK_BITS bits
#define VQ_UNPACK_ROW r
#define VQ_UNPACK_OUT ci
#include "unpack.h"

    float f_v[E];
    if (M <= 3) {

      const float f_n = TO_F32(f_s1[r]);
      if (M == 0) {
        // y^ = C_d[i] * n
        for (int e = 0; e < E; ++e) {
          f_v[e] = PIN(MUL(f_c1[ci[e]], f_n));
        }
      }
      if (M == 1) {
        // y^ = (C1_d[i] + C2_d[k]) * n: add, then multiply
#define VQ_UNPACK_WORDS codes2
#define VQ_UNPACK_BITS bits2
#define VQ_UNPACK_ROW r
#define VQ_UNPACK_OUT ck
#include "unpack.h"

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
#define VQ_UNPACK_WORDS codes2
#define VQ_UNPACK_BITS 1
#define VQ_UNPACK_ROW r
#define VQ_UNPACK_OUT cq
#include "unpack.h"

        float f_s[E];
        for (int e = 0; e < E; ++e) {
          f_s[e] = (cq[e] == 1u) ? NEG(1.0f) : 1.0f;
        }
#define f_BF_ARR f_s
#include "butterfly.h"

        for (int e = 0; e < E; ++e) {
          f_s[e] = MUL(f_s[e], f_sd);
        }
        float f_t[E];
#define VQ_FLIP_BITS tab
#define f_FLIP_SRC f_s
#define f_FLIP_DST f_t
#include "flip.h"

        const float f_g = MUL(TO_F32(f_s2[r]), f_k[1]);
        for (int e = 0; e < E; ++e) {
          const float f_eh = PIN(MUL(f_t[e], f_g));
          f_v[e] = PIN(MUL(ADD(f_c1[ci[e]], f_eh), f_n));
        }
      }
      // x^ = RHT_inverse(y^): butterfly, scale, sign flip
#define f_BF_ARR f_v
#include "butterfly.h"

      for (int e = 0; e < E; ++e) {
        f_v[e] = MUL(f_v[e], f_sd);
      }
      float f_o[E];
#define VQ_FLIP_BITS sgb
#define f_FLIP_SRC f_v
#define f_FLIP_DST f_o
#include "flip.h"

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
#include "rows_end.h"
