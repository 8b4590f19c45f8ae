// The metal prelude of the attention kernels: position, memory, sync, shuffles, atomics.
#define TID thread_position_in_threadgroup.x
#define BLOCK_X threadgroup_position_in_grid.x
#define BLOCK_Y threadgroup_position_in_grid.y
#define BLOCK_Z threadgroup_position_in_grid.z
#define NBLOCK_X threadgroups_per_grid.x
#define NBLOCK_Y threadgroups_per_grid.y
#define NBLOCK_Z threadgroups_per_grid.z
#define SHARED(type, name, n) threadgroup type name[n]
#define BARRIER() threadgroup_barrier(metal::mem_flags::mem_threadgroup)
#define VQ_BARRIER() threadgroup_barrier(metal::mem_flags::mem_threadgroup)
#define SHFL_XOR(v, m) metal::simd_shuffle_xor((v), (ushort)(m))
#define SHFL_IDX(v, i) metal::simd_shuffle((v), (ushort)(i))
#define THREADFENCE() threadgroup_barrier(metal::mem_flags::mem_device)
#define ATOMIC_ADD(p, i) metal::atomic_fetch_add_explicit((device metal::atomic_int*)(const_cast<device int*>(p) + (i)), 1, metal::memory_order_relaxed)
#define COUNT_RESET(p, i) (const_cast<device int*>(p)[(i)] = 0)
#define WARP_SYNC() metal::simdgroup_barrier(metal::mem_flags::mem_threadgroup)
