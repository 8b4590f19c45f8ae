// Kernel-scope declarations of the encode body's threadgroup arrays for the scopes whose VQ_<role>_TG is
// VQ_SHARED_PREFIX (consumed here; may be empty): Metal allows threadgroup memory only at kernel scope.
#ifndef VQ_PASTE
#define VQ_PASTE(a, p, b) VQ_PASTE_(a, p, b)
#define VQ_PASTE_(a, p, b) a##p##b
#endif
  SHARED(uint8_t, VQ_PASTE(vq, VQ_SHARED_PREFIX, _cst), 8192);
  SHARED(uint32_t, VQ_PASTE(vq, VQ_SHARED_PREFIX, _flt), 64);
  SHARED(float, VQ_PASTE(f_vq, VQ_SHARED_PREFIX, _tq), 32);
#undef VQ_SHARED_PREFIX
