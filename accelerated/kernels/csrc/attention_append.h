// The APPEND prologue of the attention partial body (attention_source.append_block): split S - 1 of each (batch,
// KV head) first encodes the chunk's new keys and values with the encode body (encode_scope.h: the append
// kernel's bytes, bit for bit) into rows nenc - t .. nenc - 1 of the buffers, then attends over those rows like any
// split. Warp 0 takes the keys and warp 1 the values, each scope seeing a grid of one single-warp group per (batch,
// KV head) (GROUP), so its barriers are warp syncs; the threadgroup barrier after both publishes the rows to the
// other warps. Each role's threadgroup arrays at kernel scope (Metal), apart: the two scopes run at once. Saves the
// append's own launch (a custom-kernel call, ~5-10 us of host time per layer on the H200's host, and its ~6 us
// latency chain on the GPU, now overlapped with the other splits). Needs one query group per KV head (nqg = 1: the
// group's only block writes). The code constants are compiled in (template KCB1, ..., VCGS).
#define VQ_SHARED_PREFIX k
#include "encode_shared.h"
#define VQ_SHARED_PREFIX v
#include "encode_shared.h"

  if ((int)BLOCK_X == (int)NBLOCK_X - 2) {
#define GROUP ((int)BLOCK_Z * (int)NBLOCK_Y + (int)BLOCK_Y)
#define NGROUPS ((int)NBLOCK_Z * (int)NBLOCK_Y)
#define WARP 0
#define NWARPS 1
#undef BARRIER
#define BARRIER() WARP_SYNC()
    if ((int)TID / 32 == 0) {
#define VQ_ROLE K
#include "encode_scope.h"
    } else if ((int)TID / 32 == 1) {
#define VQ_ROLE V
#include "encode_scope.h"
    }
#undef GROUP
#undef NGROUPS
#undef WARP
#undef NWARPS
#undef BARRIER
#define BARRIER() VQ_BARRIER()
    BARRIER();
  }
