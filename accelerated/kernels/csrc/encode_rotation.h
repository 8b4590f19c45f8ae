// The encode body's rotation family (M <= 3): row i's norm, RHT and codes, packed into codes1 / codes2 at orow.
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
#include "encode_codebook.h"
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
