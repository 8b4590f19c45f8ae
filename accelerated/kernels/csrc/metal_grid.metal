// The threadgroup's index in the grid and their count (metal), apart so that a body that rebinds them (append.h)
// can put them back (regroup.h).
#define GROUP threadgroup_position_in_grid.x
#define NGROUPS threadgroups_per_grid.x
