// The cuda prelude of the commit kernel (commit.h).
#define TID threadIdx.x
#define GROUP_X blockIdx.x
#define GROUP_Y blockIdx.y
#define NGROUPS_X gridDim.x
#define SHARED(type, name, n) __shared__ type name[n]
#define BARRIER() __syncthreads()
#define MUT(type, p) const_cast<type*>(p)
