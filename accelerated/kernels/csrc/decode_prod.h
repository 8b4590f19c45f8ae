// decode_rotation.h's turboquant_prod: y^ = (C_d[i] + the QJL sketch's residual estimate) * n into f_v.
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
