// The cuda macros of the encode body beside a kernel's position macros: cross-lane ops, exact float arithmetic,
// the body's parameters (the attention partial with the decode step's append takes these alone).
#define LANE (threadIdx.x & 31u)
#define SHFL_DOWN(v, s) __shfl_down_sync(0xffffffffu, (v), (s))
#define SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l))
#define ANY(p) (__any_sync(0xffffffffu, (p)) != 0)
#define BALLOT(p) __ballot_sync(0xffffffffu, (p))
#define ADD(a, b) __fadd_rn((a), (b))
#define SUB(a, b) __fsub_rn((a), (b))
#define MUL(a, b) __fmul_rn((a), (b))
#define DIV(a, b) __fdiv_rn((a), (b))
#define SQRT(a) __fsqrt_rn((a))
#define NEG(a) (-(a))
#define ABS(a) fabsf((a))
#define FLIP(v, m) __uint_as_float(__float_as_uint((v)) ^ (m))
#define MINF(a, b) fminf((a), (b))
#define MAXF(a, b) fmaxf((a), (b))
#define PIN(v) (v)
#define TO_F32(v) static_cast<float>(v)
#define TO_TS(v) vq_to<TS>((v))
#define VQ_OROW(bh, ne, i) ((bh) * (ne) + (i))
#define VQ_B1 B1
#define VQ_B2 B2
#define VQ_GS GS
#define VQ_KR KR
