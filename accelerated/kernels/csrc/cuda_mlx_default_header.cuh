
#include "mlx/backend/cuda/device/utils.cuh"

#include <cooperative_groups.h>

