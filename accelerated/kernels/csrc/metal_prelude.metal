// The metal prelude of the encode and decode bodies (source.py lists its macros): position, memory, sync.
#define TID thread_position_in_threadgroup.x
#define TOKEN threadgroup_position_in_grid.x
#define HEAD threadgroup_position_in_grid.y
#define BATCH threadgroup_position_in_grid.z
#define NTOK threadgroups_per_grid.x
#define NHEAD threadgroups_per_grid.y
#define WARP simdgroup_index_in_threadgroup
#define NWARPS simdgroups_per_threadgroup
#include "metal_grid.metal"
#define SHARED(type, name, n) threadgroup type name[n]
#define BARRIER() threadgroup_barrier(metal::mem_flags::mem_threadgroup)
#define WARP_SYNC() metal::simdgroup_barrier(metal::mem_flags::mem_threadgroup)
#define SHFL_XOR(v, m) metal::simd_shuffle_xor((v), (ushort)(m))
#include "metal_encode_ops.metal"
