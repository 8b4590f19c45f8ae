// Steps 3-5 of the partial kernel's scalar loop: the online softmax over a split's tokens, the merge of token
// slots and warps (tc_loop.cuh is the tensor-core alternative).
  // 3. online softmax over this split's tokens, U tokens per lane per iteration (independent loads and
  //    reductions in flight), one rescale per iteration
  constexpr int TPB = TPI * U;           // U: tokens per lane per iteration (template)
  constexpr int KP2 = (KPARTS == 2) ? QB : 1;     // sizes of arrays that only turboquant_prod uses
  constexpr int VP2 = (VPARTS == 2) ? NC : 1;
  float m[QB];
  float l[QB];
  float acc[QB][NC];
  float acc2[VPARTS == 2 ? QB : 1][VP2];
  for (int r = 0; r < QB; ++r) {
    m[r] = NEG_INF;
    l[r] = 0.0f;
    for (int c = 0; c < NC; ++c) {
      acc[r][c] = 0.0f;
      acc2[r % (VPARTS == 2 ? QB : 1)][c % VP2] = 0.0f;
    }
  }
  SHARED(float, sg, NW * TPW * U * QB);   // per token slot: the all-gather of its U x QB scores
  // the 8 values of chunk ch of a row (or of its word, loaded early): codes, then VQ_LOOKUP
#define VQ_CHUNK(B, row, ch, reg, out) { uint32_t c8_[8]; vq_codes<B>(row, ch, c8_);     for (int j_ = 0; j_ < 8; ++j_) { out[j_] = VQ_LOOKUP(reg, c8_[j_]); } }
#define VQ_CHUNK_W(B, w, ch, reg, out) { uint32_t c8_[8]; vq_codes_w<B>(w, ch, c8_);     for (int j_ = 0; j_ < 8; ++j_) { out[j_] = VQ_LOOKUP(reg, c8_[j_]); } }
  // Word-aligned code streams of the rotation family (1, 2 or 4 bits) are loaded ahead of their use: the
  // words and factors of one iteration's U tokens for keys (KPRE) and values (VPRE) at once, and with PF the
  // next iteration's while this one is scored (two register sets). Other methods load as they decode.
  constexpr bool KPRE = MK <= 2 && (KB1 == 1 || KB1 == 2 || KB1 == 4) && (MK != 1 || KB2 == 1 || KB2 == 2 || KB2 == 4);
  constexpr bool VPRE = MV <= 3 && (VB1 == 1 || VB1 == 2 || VB1 == 4) && (VB2 == 1 || VB2 == 2 || VB2 == 4);
  constexpr int KU = KPRE ? U : 1;
  constexpr int KN = KPRE ? NCH : 1;
  constexpr int VU = VPRE ? U : 1;
  constexpr int VN = VPRE ? NCH : 1;
#define VQ_LOAD(IT, K1, K2, KS0, KS1, V1, V2, VS0, VS1)   for (int u = 0; u < U; ++u) {     const int t_ = t0 + (IT) * TPB + u * TPI + warp * TPW + slot;     const int64_t tt_ = (t_ < t1) ? t_ : t0;     const int64_t tk_ = VQ_KROW(tt_);     const int64_t tv_ = VQ_VROW(tt_);     if (KPRE) {       const DEVICE uint32_t* r1_ = kc1 + (int64_t)b * kc1_strides[0] + (int64_t)h * kc1_strides[1] + tk_ * kc1_strides[2];       const DEVICE uint32_t* r2_ = kc2 + (int64_t)b * kc2_strides[0] + (int64_t)h * kc2_strides[1] + tk_ * kc2_strides[2];       for (int k = 0; k < NCH; ++k) {         K1[u % KU][k % KN] = vq_chunk_word<KB1>(r1_, lp + k * P);         if (MK == 1) { K2[u % KU][k % KN] = vq_chunk_word<KB2>(r2_, lp + k * P); }       }       KS0[u % KU] = ks0[(int64_t)b * ks0_strides[0] + (int64_t)h * ks0_strides[1] + tk_ * ks0_strides[2]];       if (MK == 2) { KS1[u % KU] = ks1[(int64_t)b * ks1_strides[0] + (int64_t)h * ks1_strides[1] + tk_ * ks1_strides[2]]; }     }     if (VPRE) {       const DEVICE uint32_t* r1_ = vc1 + (int64_t)b * vc1_strides[0] + (int64_t)h * vc1_strides[1] + tv_ * vc1_strides[2];       const DEVICE uint32_t* r2_ = vc2 + (int64_t)b * vc2_strides[0] + (int64_t)h * vc2_strides[1] + tv_ * vc2_strides[2];       for (int k = 0; k < NCH; ++k) {         V1[u % VU][k % VN] = vq_chunk_word<VB1>(r1_, lp + k * P);         if (MV == 1 || MV == 3) { V2[u % VU][k % VN] = vq_chunk_word<VB2>(r2_, lp + k * P); }       }       VS0[u % VU] = vs0[(int64_t)b * vs0_strides[0] + (int64_t)h * vs0_strides[1] + tv_ * vs0_strides[2]];       if (MV == 2 || MV == 3) { VS1[u % VU] = vs1[(int64_t)b * vs1_strides[0] + (int64_t)h * vs1_strides[1] + tv_ * vs1_strides[2]]; }     }   }
#include "partial_mixed.h"
  // this iteration's loads (p*) and, with PF, the next one's (n*)
  uint32_t pk1[KU][KN], pk2[KU][KN], pv1[VU][VN], pv2[VU][VN];
  float pks0[KU], pks1[KU], pvs0[VU], pvs1[VU];
  uint32_t nk1[PF ? KU : 1][PF ? KN : 1], nk2[PF ? KU : 1][PF ? KN : 1];
  uint32_t nv1[PF ? VU : 1][PF ? VN : 1], nv2[PF ? VU : 1][PF ? VN : 1];
  float nks0[PF ? KU : 1], nks1[PF ? KU : 1], nvs0[PF ? VU : 1], nvs1[PF ? VU : 1];
  for (int u = 0; u < KU; ++u) {
    pks1[u] = 0.0f;
    nks1[u % (PF ? KU : 1)] = 0.0f;
  }
  for (int u = 0; u < VU; ++u) {
    pvs1[u] = 0.0f;
    nvs1[u % (PF ? VU : 1)] = 0.0f;
  }
  const int n_it = (t1 - t0 + TPB - 1) / TPB;
  if (PF && (KPRE || VPRE) && !is_win && n_it > 0) {
    VQ_LOAD(0, nk1, nk2, nks0, nks1, nv1, nv2, nvs0, nvs1)
  }
  for (int it = 0; it < n_it; ++it) {
    int tu[U];
    bool ok[U];
    for (int u = 0; u < U; ++u) {
      const int t = t0 + it * TPB + u * TPI + warp * TPW + slot;
      ok[u] = t < t1;
      tu[u] = ok[u] ? t : t0;             // a readable token for lanes past the end (result unused)
    }
#include "partial_loop_loads.h"
#include "partial_loop_keys.h"
#include "partial_loop_reduce.h"
#include "partial_loop_softmax.h"
#include "partial_loop_values.h"
  }

#include "partial_merge.h"
