// Declarations of the Metal Shading Language builtins the kernel bodies of accelerated/kernels/source.py (and of
// attention_source.py: tests/test_attention_kernels_source.py) use,
// so that g++ can compile the Metal kernels (METAL_HEADER + the signature MLX's metal_kernel writes +
// METAL_PRELUDE + body) with -fsyntax-only on Linux (tests/test_kernels_source.py). It catches Metal-only
// mistakes a Linux machine can see: a CUDA name in a body, a builtin Metal does not have or with the wrong
// arity, a missing metal:: function, an implicit double. It proves nothing about Metal semantics.
// Address spaces are empty here; the lint in the test covers their rules (no local pointers, threadgroup
// arrays only at kernel scope).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#define double metal_has_no_double   // MSL has no double: any use fails to compile here too
#define device
#define constant
#define threadgroup
#define thread

typedef unsigned int uint;
typedef unsigned short ushort;
struct uint3 { uint x, y, z; };

// half and bfloat: storage types with explicit float conversions (MLX: float16_t = half, bfloat16_t)
struct half {
  uint16_t bits;
  half() = default;
  half(float f);
  operator float() const;
};
struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float f);
  operator float() const;
};
typedef half float16_t;
typedef bfloat16_t bfloat;   // MSL's bfloat (MLX's bfloat16_t)

namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
void threadgroup_barrier(mem_flags);
void simdgroup_barrier(mem_flags);

template <typename T> struct vq_simd_scalar {
  static_assert(std::is_same<T, float>::value || std::is_same<T, uint>::value || std::is_same<T, int>::value ||
                    std::is_same<T, half>::value,
                "simd_shuffle*: a 32-bit (or half) scalar");
  using type = T;
};
template <typename T> typename vq_simd_scalar<T>::type simd_shuffle(T v, ushort lane);
template <typename T> typename vq_simd_scalar<T>::type simd_shuffle_xor(T v, ushort mask);
template <typename T> typename vq_simd_scalar<T>::type simd_shuffle_down(T v, ushort delta);
bool simd_any(bool);
bool simd_all(bool);
struct simd_vote {
  using vote_t = uint64_t;
  explicit operator vote_t() const;
};
simd_vote simd_ballot(bool);

namespace precise {
float divide(float, float);
float sqrt(float);
}  // namespace precise
float abs(float);
float fmin(float, float);
float fmax(float, float);
float exp2(float);
// the attention kernels' fused combine (compiled, never taken on Metal: FUSED = 0 there)
struct atomic_int { int v; };
enum memory_order { memory_order_relaxed };
int atomic_fetch_add_explicit(device atomic_int* object, int operand, memory_order order);

template <typename T, typename U> T as_type(U u) {
  static_assert(sizeof(T) == sizeof(U), "as_type: same size");
  T t;
  std::memcpy(&t, &u, sizeof(T));
  return t;
}
}  // namespace metal

using namespace metal;   // as MLX's metal utils header does
