// The encode body for one role in its own scope (append.h, attention_append.h): the role's inputs behind the body's
// names, its output rows in the streams' buffers (VQ_OROW: row base + i of head bh), its fault slots [index][GROUP].
// VQ_ROLE (K or V, consumed here) picks the role's parameters VQ_<role>_*, which the loader defines: M, B1, B2, GS,
// TS (method id, code constants, side dtype: template names or literals), X, X_SHAPE, X_STRIDES, CONST (inputs),
// CODES1, CODES2, S1, S2 (the arrays behind the body's outputs), FAULT, INDEX (0: the keys), CAP (rows of the buffers),
// GCAP (rows of the group fields: KIVI keys' scale and zero, one row per GS tokens), BASE (the chunk's first row: a
// multiple of GS for KIVI keys), TG (the prefix of the threadgroup arrays the kernel declares for it, encode_shared.h); and
// VQ_CONST_B1 .. VQ_CONST_META, the offsets of append.constants' layout.
#ifndef VQ_SCOPE
#define VQ_SCOPE(name) VQ_SCOPE_(VQ_ROLE, name)
#define VQ_SCOPE_(role, name) VQ_SCOPE__(role, name)
#define VQ_SCOPE__(role, name) VQ_##role##_##name
#endif

  {
    constexpr int M = VQ_SCOPE(M);
    constexpr int B1 = VQ_SCOPE(B1);
    constexpr int B2 = VQ_SCOPE(B2);
    constexpr int GS = VQ_SCOPE(GS);
    constexpr int KR = (M == 4 && VQ_SCOPE(INDEX) == 0) ? 1 : 0;   // KIVI keys: per-channel groups of GS tokens
    using TS = VQ_SCOPE(TS);
    VQ_REF x_shape = VQ_SCOPE(X_SHAPE);
    VQ_REF x_strides = VQ_SCOPE(X_STRIDES);
    const auto x = VQ_SCOPE(X);
    const int vq_sw = (int)VQ_SCOPE(X_SHAPE)[1] * ((D + 31) / 32);
    const VQ_DEV uint32_t* sig = VQ_SCOPE(CONST);
    const VQ_DEV uint32_t* tau = VQ_SCOPE(CONST) + vq_sw;
    const VQ_DEV float* f_c1 = reinterpret_cast<const VQ_DEV float*>(VQ_SCOPE(CONST) + 2 * vq_sw);
    const VQ_DEV float* f_b1 = f_c1 + VQ_CONST_B1;
    const VQ_DEV float* f_c2 = f_c1 + VQ_CONST_C2;
    const VQ_DEV float* f_b2 = f_c1 + VQ_CONST_B2;
    const VQ_DEV float* f_k = f_c1 + VQ_CONST_K;
    const VQ_DEV int32_t* meta = reinterpret_cast<const VQ_DEV int32_t*>(VQ_SCOPE(CONST) + 2 * vq_sw + VQ_CONST_META);
    auto codes1 = VQ_MUT(uint32_t, VQ_SCOPE(CODES1));
    auto codes2 = VQ_MUT(uint32_t, VQ_SCOPE(CODES2));
    auto f_s1 = VQ_MUT(TS, VQ_SCOPE(S1));
    auto f_s2 = VQ_MUT(TS, VQ_SCOPE(S2));
    auto fault = VQ_SCOPE(FAULT) + VQ_SCOPE(INDEX) * 2 * (int)NGROUPS;
    const int vq_cap = VQ_SCOPE(CAP);               // rows of the buffers
    const int vq_base = VQ_SCOPE(BASE);             // first row of this chunk
    const int vq_gcap = VQ_SCOPE(GCAP);             // rows of the group fields (KIVI keys' scale and zero)
    (void)vq_gcap;
#undef VQ_OROW
#define VQ_OROW(bh, ne, i) ((bh) * vq_cap + vq_base + (i))
#undef VQ_TROW
#define VQ_TROW(bh, nq, t) ((bh) * vq_cap + vq_base + (t))
#undef VQ_GROW
#define VQ_GROW(bh, ne, i) ((bh) * vq_gcap + vq_base / gs + (i))
#include "encode.h"
  }
#undef VQ_TROW
#undef VQ_GROW
#undef VQ_X_OWN
#undef VQ_ROLE
