// The encode body's KIVI values and mlx_affine: one token's groups of gs channels, their fields and codes at orow.
    if ((M == 4 && keys == 0) || M == 5) {
      // kivi values / mlx_affine: groups of gs consecutive channels of one token
#define VQ_X_TOKEN i
#include "load_x.h"
#include "group_minmax.h"

#include "encode_affine_params.h"
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
