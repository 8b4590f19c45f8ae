// Write VQ_W_ROW of the commit: destination VQ_W_DST (of type VQ_W_TYPE) = source VQ_W_SRC, both VQ_W_NDIM-
// dimensional with their own strides (VQ_W_SRC_SHAPE, ...). Parameters consumed here.

  if (which == VQ_W_ROW) {
    const int64_t n = (int64_t)VQ_W_SRC_SHAPE[0]
#if VQ_W_NDIM > 1
        * (int64_t)VQ_W_SRC_SHAPE[1]
#endif
#if VQ_W_NDIM > 2
        * (int64_t)VQ_W_SRC_SHAPE[2]
#endif
#if VQ_W_NDIM > 3
        * (int64_t)VQ_W_SRC_SHAPE[3]
#endif
#if VQ_W_NDIM > 4
        * (int64_t)VQ_W_SRC_SHAPE[4]
#endif
#if VQ_W_NDIM > 5
        * (int64_t)VQ_W_SRC_SHAPE[5]
#endif
        ;
    for (int64_t e = (int64_t)col * VQ_NT + tid; e < n; e += (int64_t)ncol * VQ_NT) {
#define VQ_OFF_VAR src
#define VQ_OFF_SHAPE VQ_W_SRC_SHAPE
#define VQ_OFF_STRIDES VQ_W_SRC_STRIDES
#define VQ_OFF_NDIM VQ_W_NDIM
#include "commit_offset.h"
#define VQ_OFF_VAR dst
#define VQ_OFF_SHAPE VQ_W_DST_SHAPE
#define VQ_OFF_STRIDES VQ_W_DST_STRIDES
#define VQ_OFF_NDIM VQ_W_NDIM
#include "commit_offset.h"
      MUT(VQ_W_TYPE, VQ_W_DST)[dst] = VQ_W_SRC[src];
    }
  }
#undef VQ_W_ROW
#undef VQ_W_TYPE
#undef VQ_W_NDIM
#undef VQ_W_SRC
#undef VQ_W_SRC_SHAPE
#undef VQ_W_SRC_STRIDES
#undef VQ_W_DST
#undef VQ_W_DST_SHAPE
#undef VQ_W_DST_STRIDES
