// The encode body's threadgroup arrays in a scope of a bigger kernel (encode_scope.h; encode.h's VQ_ENCODE_ARRAYS):
// Metal allows threadgroup arrays only at kernel scope, so the kernel declares them (encode_shared.h) and the scope
// points at its own (VQ_<role>_TG: their prefix).
  VQ_TG uint8_t* cst = VQ_PASTE(vq, VQ_SCOPE(TG), _cst);
  VQ_TG uint32_t* flt = VQ_PASTE(vq, VQ_SCOPE(TG), _flt);
  VQ_TG float* f_tq = VQ_PASTE(f_vq, VQ_SCOPE(TG), _tq);
