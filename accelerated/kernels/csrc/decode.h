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
#include "decode_rotation.h"
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
