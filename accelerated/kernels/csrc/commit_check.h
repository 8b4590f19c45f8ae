// Check VQ_C_ROW of the commit: whether any element of VQ_C_ARR (VQ_C_NDIM-dimensional, VQ_C_SHAPE, VQ_C_STRIDES)
// is not finite, or with VQ_C_FLAG nonzero (a fault flag). Parameters consumed here.

  if (which == VQ_C_ROW) {
    const int64_t n = (int64_t)VQ_C_ARR_SHAPE[0]
#if VQ_C_NDIM > 1
        * (int64_t)VQ_C_ARR_SHAPE[1]
#endif
#if VQ_C_NDIM > 2
        * (int64_t)VQ_C_ARR_SHAPE[2]
#endif
#if VQ_C_NDIM > 3
        * (int64_t)VQ_C_ARR_SHAPE[3]
#endif
#if VQ_C_NDIM > 4
        * (int64_t)VQ_C_ARR_SHAPE[4]
#endif
#if VQ_C_NDIM > 5
        * (int64_t)VQ_C_ARR_SHAPE[5]
#endif
        ;
    for (int64_t e = (int64_t)col * VQ_NT + tid; e < n; e += (int64_t)ncol * VQ_NT) {
#define VQ_OFF_VAR off
#define VQ_OFF_SHAPE VQ_C_ARR_SHAPE
#define VQ_OFF_STRIDES VQ_C_ARR_STRIDES
#define VQ_OFF_NDIM VQ_C_NDIM
#include "commit_offset.h"
      const float v = static_cast<float>(VQ_C_ARR[off]);
#if VQ_C_FLAG
      if (v != 0.0f) {
#else
      if (!isfinite(v)) {
#endif
        mine = 1u;
      }
    }
  }
#undef VQ_C_ROW
#undef VQ_C_NDIM
#undef VQ_C_ARR
#undef VQ_C_ARR_SHAPE
#undef VQ_C_ARR_STRIDES
#undef VQ_C_FLAG
