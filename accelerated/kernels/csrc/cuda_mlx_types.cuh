// What kernel_cache compiles in place of MLX's default header (cuda_mlx_default_header.cuh), whose files live
// inside libmlx, not on disk: the same types under the same names, so that a kernel's parameters are laid out
// as MLX's launch passes them (MLX's device/config.h: MAX_NDIM 10).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cooperative_groups.h>
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, 10>;
using Strides = cuda::std::array<int64_t, 10>;
}

