namespace mlx::core::cu {

namespace cg = cooperative_groups;

__global__ void 