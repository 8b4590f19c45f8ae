// The metal prelude of the commit kernel (commit.h).
#define TID thread_position_in_threadgroup.x
#define GROUP_X threadgroup_position_in_grid.x
#define GROUP_Y threadgroup_position_in_grid.y
#define NGROUPS_X threadgroups_per_grid.x
#define SHARED(type, name, n) threadgroup type name[n]
#define BARRIER() threadgroup_barrier(metal::mem_flags::mem_threadgroup)
#define MUT(type, p) const_cast<device type*>(p)
using metal::isfinite;
