// The combine inside the partial launch (FUSED): the block of a (batch x query group, KV head) that finishes last
// merges its S + 1 splits. Each block makes its partial visible device-wide and counts itself in cnt (persistent,
// zero between launches); the block that reads S is last and sets the count back to zero. VQ_COMBINE_ROWS: the
// rows' file (combine_rows.h, or the tensor-core kernel's combine_rows_strided.h).

  SHARED(int, slast, 1);                 // kernel scope: Metal compiles this text too (FUSED = 0 there)
  if (FUSED) {
    THREADFENCE();
    BARRIER();
    if (tid == 0) {
      slast[0] = (ATOMIC_ADD(cnt, (int)BLOCK_Z * hkv + h) == S) ? 1 : 0;
    }
    BARRIER();
    if (slast[0] != 0) {
      THREADFENCE();
      TGMEM float* cy = sq;
      TGMEM float* cy2 = sq2;
      const int CR0 = qg * QB;
      const int CR1 = vq_min(nq, qg * QB + QB);
      const int CT = tid;
      constexpr int CNT = NT;
#include VQ_COMBINE_ROWS

      if (tid == 0) {
        COUNT_RESET(cnt, (int)BLOCK_Z * hkv + h);
      }
    }
  }
