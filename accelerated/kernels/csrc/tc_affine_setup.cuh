// tc_affine_loop.cuh's setup: mlx_affine records (MK = MV = 5) on tensor cores; fragment maps as tc_loop_setup.cuh's.
  // keys and values x = T(T(c s) + b) per token and group of G coordinates (spec/methods/mlx_affine.md; T the
  // records' dtype) are dequantized in registers, times a power of two, into the B (keys) and A (values) operands:
  // neither scale can be folded into the query or the probabilities, since one key k-step takes coordinates of four
  // lane quarters' groups and one value m-tile coordinates of eight lane groups. A 16-bit x times a power of two is
  // exact in float16 (its 8 or 11 bits; only bits below float16's 2^-24 are lost, which a lo part could not hold
  // either), so 16-bit records take one mma per step; float32 records two (hi and lo parts, as tc_loop.cuh's)
  constexpr int KS = D / 16;
#include "tc_words_sizes.cuh"
  constexpr int MT = D / 16;
  constexpr uint32_t KMASK = (1u << KB1) - 1u;
  constexpr uint32_t VMASK = (1u << VB1) - 1u;
  constexpr bool KLO = sizeof(kgs[0]) > 2;
  constexpr bool VLO = sizeof(vgs[0]) > 2;
#include "tc_lanes.cuh"
  float fqa = 1.0f;
#define VQ_TC_Q sq
#define VQ_TC_FQ fqa
#define VQ_TC_QA(ks) qa[ks]
#include "tc_query_scale.cuh"
  uint32_t qa[KS][2];
#include "tc_query_frag.cuh"
  const float uka = 1.0f / fqa;           // exact: a power of two
  const float ftv = 1024.0f;              // P' = p * 2^10 (p <= 1); the values' A scale fv as the norms' scale
  const int nch = is_win ? 0 : (t1 - t0 + 15) / 16;    // the window split: tc_window.h
#include "tc_state.cuh"
  // a lane quarter's D / 4 key coordinates lie in one group (D / 4 <= 32 <= G): one (s, b) per token
  const DEVICE uint32_t* kbase = kc1 + (int64_t)b * kc1_strides[0] + (int64_t)h * kc1_strides[1] + KWL * tig;
  const int64_t kgo = (int64_t)b * kgs_strides[0] + (int64_t)h * kgs_strides[1]
                      + (int64_t)((tig * (D / 4)) / KG) * kgs_strides[3];
  // ... and a lane group's D / 8 value coordinates (value words as tc_loop_setup.cuh's)
  const int vsh = VWHOLE ? 0 : (g * (D / 8) * VB1) % 32;
  const DEVICE uint32_t* vbase = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1]
                                 + (VWHOLE ? VWL * g : (g * (D / 8) * VB1) / 32);
  const int64_t vgo = (int64_t)b * vgs_strides[0] + (int64_t)h * vgs_strides[1]
                      + (int64_t)((g * (D / 8)) / VG) * vgs_strides[3];
