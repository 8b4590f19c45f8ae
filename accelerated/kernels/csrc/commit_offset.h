// VQ_OFF_VAR = the offset of flat element e of an array through its shape and strides (VQ_OFF_SHAPE,
// VQ_OFF_STRIDES; VQ_OFF_NDIM dimensions, 1 .. 6): the last dimension fastest. Parameters consumed here.
      int64_t VQ_OFF_VAR = 0;
      {
        int64_t rest = e;
#if VQ_OFF_NDIM > 5
        VQ_OFF_VAR += (rest % VQ_OFF_SHAPE[5]) * VQ_OFF_STRIDES[5];
        rest /= VQ_OFF_SHAPE[5];
#endif
#if VQ_OFF_NDIM > 4
        VQ_OFF_VAR += (rest % VQ_OFF_SHAPE[4]) * VQ_OFF_STRIDES[4];
        rest /= VQ_OFF_SHAPE[4];
#endif
#if VQ_OFF_NDIM > 3
        VQ_OFF_VAR += (rest % VQ_OFF_SHAPE[3]) * VQ_OFF_STRIDES[3];
        rest /= VQ_OFF_SHAPE[3];
#endif
#if VQ_OFF_NDIM > 2
        VQ_OFF_VAR += (rest % VQ_OFF_SHAPE[2]) * VQ_OFF_STRIDES[2];
        rest /= VQ_OFF_SHAPE[2];
#endif
#if VQ_OFF_NDIM > 1
        VQ_OFF_VAR += (rest % VQ_OFF_SHAPE[1]) * VQ_OFF_STRIDES[1];
        rest /= VQ_OFF_SHAPE[1];
#endif
        VQ_OFF_VAR += (rest % VQ_OFF_SHAPE[0]) * VQ_OFF_STRIDES[0];
        rest /= VQ_OFF_SHAPE[0];
      }
#undef VQ_OFF_VAR
#undef VQ_OFF_SHAPE
#undef VQ_OFF_STRIDES
#undef VQ_OFF_NDIM
