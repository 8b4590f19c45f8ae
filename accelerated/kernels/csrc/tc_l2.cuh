// tuning's tc_l2_prefetch (the launch's header, before VQ_TCL2's loops: csrc/tc_l2_ahead.cuh): the line holding p
// asked into L2, generic addressing
__device__ inline void vq_l2(const void* p) { asm volatile("prefetch.L2 [%0];" ::"l"(p)); }
