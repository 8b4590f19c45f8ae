// The value side of a tensor-core loop's TC_LOAD for values with a scale and zero per token and coordinate group (KIVI
// values: tc_kivi_loop.cuh, tc_mixed_loop.cuh; mlx_affine: tc_affine_loop.cuh), written into its loop over value slots
// x: TC_VGROUP(VS, VZ) the token's scale and zero of this lane group's group (vgo), bd_ their largest
// (2^VB1 - 1) |s| + |z|; after that loop, TC_VNORM(VN): bd_ over the warp as every slot's VN (the softmax fragment's
// value norm: fv puts it below 2^11).
#define TC_VGROUP(VS, VZ) \
      VS[x] = static_cast<float>(vgs[vgo + tt_ * vgs_strides[2]]); \
      VZ[x] = static_cast<float>(vgz[vgo + tt_ * vgs_strides[2]]); \
      bd_ = vq_max(bd_, (float)VMASK * fabsf(VS[x]) + fabsf(VZ[x]));
#define TC_VNORM(VN) \
    for (int o_ = 4; o_ < 32; o_ <<= 1) { \
      bd_ = vq_max(bd_, SHFL_XOR(bd_, o_)); \
    } \
    for (int x = 0; x < 4; ++x) { \
      VN[x] = bd_; \
    }
