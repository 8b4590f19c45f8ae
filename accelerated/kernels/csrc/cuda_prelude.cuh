// The cuda prelude of the encode and decode bodies (source.py lists its macros): position, memory, sync.
#define TID threadIdx.x
#define TOKEN blockIdx.x
#define HEAD blockIdx.y
#define BATCH blockIdx.z
#define NTOK gridDim.x
#define NHEAD gridDim.y
#define WARP (threadIdx.x >> 5)
#define NWARPS (blockDim.x >> 5)
#include "cuda_grid.cuh"
#define SHARED(type, name, n) __shared__ type name[n]
#define BARRIER() __syncthreads()
#define WARP_SYNC() __syncwarp()
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#include "cuda_encode_ops.cuh"
