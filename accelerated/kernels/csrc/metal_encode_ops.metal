// The metal macros of the encode body beside a kernel's position macros: cross-lane ops, exact float arithmetic,
// the body's parameters (the attention partial with the decode step's append takes these alone).
#define LANE thread_index_in_simdgroup
#define SHFL_DOWN(v, s) metal::simd_shuffle_down((v), (ushort)(s))
#define SHFL(v, l) metal::simd_shuffle((v), (ushort)(l))
#define ANY(p) metal::simd_any((p))
#define BALLOT(p) vq_ballot((p))
#define ADD(a, b) vq_add((a), (b))
#define SUB(a, b) vq_sub((a), (b))
#define MUL(a, b) vq_mul((a), (b))
#define DIV(a, b) vq_div((a), (b))
#define SQRT(a) vq_sqrt((a))
#define NEG(a) (-(a))
#define ABS(a) metal::abs((a))
#define FLIP(v, m) as_type<float>(as_type<uint>((v)) ^ (m))
#define MINF(a, b) metal::fmin((a), (b))
#define MAXF(a, b) metal::fmax((a), (b))
#define PIN(v) vq_pin((v), pin0)
#define TO_F32(v) static_cast<float>(v)
#define TO_TS(v) static_cast<TS>((v))
#define VQ_OROW(bh, ne, i) ((bh) * (ne) + (i))
#define VQ_B1 B1
#define VQ_B2 B2
#define VQ_GS GS
#define VQ_KR KR
