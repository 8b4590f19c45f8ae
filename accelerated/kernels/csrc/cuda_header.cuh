// The cuda header of the encode and decode kernels: the exact-arithmetic helpers behind the prelude's macros.
template <typename T> __device__ __forceinline__ T vq_to(float f);
template <> __device__ __forceinline__ float vq_to<float>(float f) { return f; }
template <> __device__ __forceinline__ __half vq_to<__half>(float f) { return __float2half_rn(f); }
template <> __device__ __forceinline__ __nv_bfloat16 vq_to<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}
