// tc_loop.cuh's online softmax over one chunk: probabilities pa, the running m_a and l_a, O rescaled (alpha, rs).
    // -- online softmax per row over the chunk (a row's 16 tokens lie in its 4 lanes tig)
    float pa[4];
    float mb = vq_max(vq_max(xa[0], xa[1]), vq_max(xa[2], xa[3]));
    mb = vq_max(mb, SHFL_XOR(mb, 1));
    mb = vq_max(mb, SHFL_XOR(mb, 2));
    const float mn = vq_max(m_a, mb);
    float ls = 0.0f;
    for (int x = 0; x < 4; ++x) {
      pa[x] = (mn == NEG_INF) ? 0.0f : vq_exp2(xa[x] - mn);
      ls += pa[x];
    }
    const float alpha = (mn == NEG_INF) ? 1.0f : vq_exp2(m_a - mn);
    l_a = l_a * alpha + ls;
    m_a = mn;
    // the chunk's largest value norm (its 16 tokens are the 4 slots of lanes tig, the same for every g)
    float cv = vq_max(vq_max(fabsf(vnc[0]), fabsf(vnc[1])), vq_max(fabsf(vnc[2]), fabsf(vnc[3])));
    cv = vq_max(cv, SHFL_XOR(cv, 1));
    cv = vq_max(cv, SHFL_XOR(cv, 2));
    float rs = 1.0f;                      // warp-uniform: O's rescale for a lower fv
    if (fv == 0.0f || cv * fv >= 2048.0f) {
      const float fn = vq_pow2_for(cv, 11);
      rs = (fv == 0.0f) ? 1.0f : fn / fv;
      fv = fn;
    }
    if (VQ_ANY(alpha != 1.0f) || rs != 1.0f) {
      // O^T column n = 2 tig + e holds row n % 4: its alpha is lane 4 (n % 4)'s
      const float al0 = SHFL_IDX(alpha, 4 * ((2 * tig) & 3)) * rs;
      const float al1 = SHFL_IDX(alpha, 4 * ((2 * tig + 1) & 3)) * rs;
      for (int mt = 0; mt < MT; ++mt) {
        o[mt][0] *= al0;
        o[mt][1] *= al1;
        o[mt][2] *= al0;
        o[mt][3] *= al1;
      }
    }
#include VQ_TC_SOFTMAX2
