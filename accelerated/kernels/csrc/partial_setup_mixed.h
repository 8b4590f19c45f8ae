// partial_setup_tokens.h's token ranges of a MIXED partial (not ragged: partial_setup_mixed_ragged.h): splits 0 ..
// S - MS - 1 the roles' common encoded tokens from the row's start to QLO, evenly; splits S - MS .. S - 1 in scalar
// arithmetic (tc_mixed_split.h), MS at most VQ_MIXS (tuning's tc_mixed_splits, tensor-core texts; 1 elsewhere). With
// VQ_MIXR (tuning's tc_mixed_cost: a scalar token's cost in tensor-core tokens) MS is the fewest splits that balance
// the two: a tensor-core split's tokens against VQ_MIXR times a scalar split's (VQ_MS below); VQ_MIXR 0: VQ_MIXS.
#ifndef VQ_MIXS
#define VQ_MIXS 1
#endif
#ifndef VQ_MIXR
#define VQ_MIXR 0
#endif
#undef VQ_MS
#undef VQ_MSN
#undef VQ_MIXE
#undef VQ_MIXX
#undef VQ_MB
#undef VQ_MC
#undef VQ_IMAX
#undef VQ_MIX0
#undef VQ_XA
#undef VQ_XG
#undef VQ_XGOF
#undef VQ_LO0
// (the row's first token: its start under ragged starts)
#define VQ_LO0 (VQ_STARTS ? vq_min((int)rstart[b], QLO) : 0)
// (VQ_XA and VQ_XGOF are macros, not registers: the scalar splits read them after the mma loop; the count VQ_MS is
// the setup's alone; VQ_MIXS 1: the text before the knob)
#if VQ_MIXS == 1
#define VQ_MS 1
#define VQ_MIX0 (S - 1)
#define VQ_XA 0
#define VQ_XG 0
#define VQ_XGOF(T1) 0
  if (!is_win) {
    const int SO = S - 1;
    const int lo0 = VQ_LO0;
    const int chunk = (QLO - lo0 + SO - 1) / SO;
    t0 = (s == S - 1) ? QLO : vq_min(QLO, lo0 + s * chunk);
    t1 = (s == S - 1) ? WQ : vq_min(QLO, t0 + chunk);
  }
#else
// (integers throughout: vq_max is float's)
#define VQ_IMAX(A, B) ((A) > (B) ? (A) : (B))
#define VQ_MIX0 (S - VQ_MS)
#define VQ_XA vq_min(QK, QV)
#define VQ_MB VQ_IMAX(VQ_XA, VQ_IMAX(QK - VQ_KTENC, QV - VQ_VTENC))
#define VQ_MSN vq_min(VQ_MIXS, S - 1)
#if VQ_MIXR > 0
// (ceil(R X S / (E + R X)) for E tensor-core tokens, X scalar ones: from it on S - MS splits of E / (S - MS) tokens
// take no less than MS of R X / MS; per row, from its counts, so all of the row's splits agree. Computed once: only
// the setup reads it, split S - 1's skip after the loop is VQ_XGOF's)
#define VQ_MIXE (QLO - VQ_LO0)
#define VQ_MIXX (VQ_MIXR * (VQ_MB - VQ_XA))
  const int vq_ms = VQ_IMAX(1, vq_min(VQ_MSN, (VQ_MIXX * S + VQ_MIXE + VQ_MIXX - 1) / VQ_IMAX(1, VQ_MIXE + VQ_MIXX)));
#else
  const int vq_ms = VQ_IMAX(1, VQ_MSN);
#endif
#define VQ_MS vq_ms
#define VQ_MC ((VQ_MB - VQ_XA + VQ_MS - 1) / VQ_MS)
#define VQ_XG (vq_min(VQ_MB, VQ_XA + (VQ_MS - 1) * VQ_MC) - VQ_XA)
// (VQ_XG again from split S - 1's t1, WQ - VQ_XG: after the mma loop, without VQ_MS's divisions)
#define VQ_XGOF(T1) (WQ - (T1))
  if (!is_win) {
    // VQ_MS splits (at most tuning's tc_mixed_splits) share VQ_XA .. VQ_MB - 1, where one role is exact and the other's
    // records are older than this launch; split S - 1 alone takes the rows the append encodes, at either end of
    // QLO .. WQ - 1 (its tokens skip VQ_XG from VQ_XA on: the other scalar splits')
    const int SO = VQ_MIX0;
    const int lo0 = VQ_LO0;
    const int chunk = (QLO - lo0 + SO - 1) / SO;
    t0 = (s == S - 1) ? QLO : (s >= SO) ? vq_min(VQ_MB, VQ_XA + (s - SO) * VQ_MC) : vq_min(QLO, lo0 + s * chunk);
    t1 = (s == S - 1) ? WQ - VQ_XG : (s >= SO) ? vq_min(VQ_MB, t0 + VQ_MC) : vq_min(QLO, t0 + chunk);
  }
#endif
