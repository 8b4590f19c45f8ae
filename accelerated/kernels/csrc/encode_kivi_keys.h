// The encode body's KIVI keys: row i is a group of gs tokens; scale / zero rows at orow, codes one row per token.
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
