// The threadgroup's index in the grid and their count (cuda), apart so that a body that rebinds them (append.h)
// can put them back (regroup.h).
#define GROUP blockIdx.x
#define NGROUPS gridDim.x
