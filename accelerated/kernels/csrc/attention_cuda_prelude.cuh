// The cuda prelude of the attention kernels: position, memory, sync, shuffles, atomics.
#define TID threadIdx.x
#define BLOCK_X blockIdx.x
#define BLOCK_Y blockIdx.y
#define BLOCK_Z blockIdx.z
#define NBLOCK_X gridDim.x
#define NBLOCK_Y gridDim.y
#define NBLOCK_Z gridDim.z
#define SHARED(type, name, n) __shared__ type name[n]
#define BARRIER() __syncthreads()
#define VQ_BARRIER() __syncthreads()
#define VQ_UNROLL _Pragma("unroll")
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define SHFL_IDX(v, i) __shfl_sync(0xffffffffu, (v), (i))
#define THREADFENCE() __threadfence()
#define ATOMIC_ADD(p, i) atomicAdd(const_cast<int*>(p) + (i), 1)
#define COUNT_RESET(p, i) (const_cast<int*>(p)[(i)] = 0)
#define WARP_SYNC() __syncwarp()
