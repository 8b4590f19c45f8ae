// encode_rotation.h's codebook methods (M = 0, 1, 3): y (f_v) quantized into c1, c2 (rvq residual, prod sketch).
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
