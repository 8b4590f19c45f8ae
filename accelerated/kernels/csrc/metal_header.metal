// The metal header of the encode and decode kernels: the exact-arithmetic helpers behind the prelude's macros.
#pragma clang fp contract(off)
inline float vq_add(float a, float b) { return a + b; }
inline float vq_sub(float a, float b) { return a - b; }
inline float vq_mul(float a, float b) { return a * b; }
inline float vq_div(float a, float b) { return metal::precise::divide(a, b); }
inline float vq_sqrt(float a) { return metal::precise::sqrt(a); }
inline float vq_pin(float v, uint z) { return as_type<float>(as_type<uint>(v) ^ z); }
inline uint vq_ballot(bool p) { return (uint)(static_cast<uint64_t>(metal::simd_ballot(p)) & 0xffffffffull); }
