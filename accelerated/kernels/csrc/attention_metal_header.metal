// The attention kernels' header (metal): address spaces, float helpers, then the shared helpers.
#define VQ_INLINE inline
#define DEVICE device
#define TGMEM threadgroup
#define THREAD thread
#define NEG_INF (-INFINITY)
inline float vq_exp2(float x) { return metal::exp2(x); }
inline float vq_max(float a, float b) { return metal::fmax(a, b); }
inline int vq_min(int a, int b) { return a < b ? a : b; }
inline float vq_round_to(float, float x) { return x; }
inline float vq_round_to(half, float x) { return static_cast<float>(static_cast<half>(x)); }
inline float vq_round_to(bfloat, float x) { return static_cast<float>(static_cast<bfloat>(x)); }
#include "attention_helpers.h"
