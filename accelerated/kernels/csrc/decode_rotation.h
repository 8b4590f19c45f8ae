// The decode body's rotation family (M <= 3): row r's codes and fields to y^, then the inverse RHT, into f_v.

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
#include "decode_prod.h"
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
