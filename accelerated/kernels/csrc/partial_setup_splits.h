// partial_setup_tokens.h's end: a MIXED partial's scalar splits are VQ_MIX0 .. S - 1, split S - 1's tokens skipping
// VQ_XG from VQ_XA on (partial_setup_mixed.h); in every other partial split S - 1 alone, its tokens in order. (Each
// kernel sets them anew: a unit of several kernels, as the compile tests build, must not keep another's.)
#if !VQ_MIXED || VQ_RAGGED
#undef VQ_MIX0
#undef VQ_XA
#undef VQ_XG
#undef VQ_XGOF
#define VQ_MIX0 (S - 1)
#define VQ_XA 0
#define VQ_XG 0
#define VQ_XGOF(T1) 0
#endif
