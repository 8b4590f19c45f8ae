// The combine as its own launch: a threadgroup of CNT threads (a multiple of D, CG = CNT / D groups of D) per query
// row, the splits spread over the threads: each split's weight exp2(m_s - m) once (threadgroup memory), then
// thread CT sums coordinate CT % D over splits CT / D, + CG, ... with independent loads, and the CG group sums
// are added. One thread per coordinate walking all S splits (combine_rows.h, the fused scalar kernel's) was a
// chain of S dependent round trips to L2: ~8-10 us per launch on the H200 at S = 16-32. VQ_MAX_SPLITS: the most
// splits (S + 1 with the window) one launch takes (attention_source.MAX_SPLITS).

  constexpr bool VROT = MV <= 3;
  constexpr int VPARTS = (MV == 3) ? 2 : 1;
  constexpr int CG = CNT / D;
  constexpr int NWC = CNT / 32;
  const int h = (int)BLOCK_Y;
  const int b = (int)BLOCK_Z;
  const int r = (int)BLOCK_X;
  const int nq = (int)NBLOCK_X;
  const int hkv = (int)NBLOCK_Y;
  const int S = (int)o_ml_shape[3] - 1;
  const int L = (int)q_shape[2];
  const int hq = (int)q_shape[1];
  const int rep = hq / hkv;
  const int CT = (int)TID;
  const int lane = CT % 32;
  const int wc = CT / 32;
  SHARED(float, cw, VQ_MAX_SPLITS);
  SHARED(float, cred, 2 * NWC);
  SHARED(float, cpart, VPARTS * CNT);
  SHARED(float, cy, D);
  SHARED(float, cy2, VPARTS == 2 ? D : 1);
  const int64_t row0 = (((int64_t)b * hkv + h) * nq + r) * (S + 1);
  // (a) m: the splits' maxima, strided over the threads, then over a warp's lanes and the warps
  float pm = NEG_INF;
  for (int s2 = CT; s2 < S; s2 += CNT) {
    pm = vq_max(pm, o_ml[(row0 + s2) * 2]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    pm = vq_max(pm, SHFL_XOR(pm, o));
  }
  if (lane == 0) {
    cred[wc] = pm;
  }
  BARRIER();
  float me = NEG_INF;
  for (int w = 0; w < NWC; ++w) {
    me = vq_max(me, cred[w]);
  }
  // (b) each split's weight, and l: the splits' sums times their weights, likewise
  float pl = 0.0f;
  for (int s2 = CT; s2 < S; s2 += CNT) {
    const float ms = o_ml[(row0 + s2) * 2];
    const float w = (ms == NEG_INF) ? 0.0f : vq_exp2(ms - me);
    cw[s2] = w;
    pl += o_ml[(row0 + s2) * 2 + 1] * w;
  }
  for (int o = 16; o > 0; o >>= 1) {
    pl += SHFL_XOR(pl, o);
  }
  if (lane == 0) {
    cred[NWC + wc] = pl;
  }
  BARRIER();
  float le = 0.0f;
  for (int w = 0; w < NWC; ++w) {
    le += cred[NWC + w];
  }
#include "combine_values.h"
#include "combine_row_end.h"
