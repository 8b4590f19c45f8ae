// partial_setup_tokens.h's token ranges of a MIXED partial over ragged rows (VQ_RAGGED: accelerated/cache/ragged.py):
// the KIVI role (template RW: its R; VQ_RKEYS 0: the values, unit VG; 1: the keys, unit KG) ends its encoded tokens at
// row b's own boundary, from its group phase, at or past its count QV (QK) where its window's rows start; the other
// role is per token (phase 0): every row's at its count QK (QV).
  const int vq_ph = (int)rphase[b];
  const int vq_u = T - RW - vq_ph;
#if VQ_RKEYS
  const int QKR = vq_u >= 0 ? vq_ph + (vq_u / KG) * KG : 0;
  const int QVR = QV;             // (partial_loop_values.h's exact test: the values' count in every row)
#define VQ_RB QKR
#define VQ_RU KG
#define VQ_OEO QV
#define VQ_OTENC VQ_VTENC
#else
  const int QVR = vq_u >= 0 ? vq_ph + (vq_u / VG) * VG : 0;
#define VQ_RB QVR
#define VQ_RU VG
#define VQ_OEO QK
#define VQ_OTENC VQ_KTENC
#endif
  {
    // row b: splits 0 .. S - 2 its tokens from its start that both roles hold encoded (up to E), split S - 1 those
    // one role holds exact (a role's window past its boundary) up to WR, the window split from WR: both exact
    const int vq_st = (int)rstart[b];
#if VQ_RAGGED_APPEND
    // with the step's append inside: what it encodes (the per-token role's token, a flushing row's KIVI group, from
    // its boundary - its unit) goes to split S - 1, which wrote it
    const int E = vq_min(VQ_OEO - VQ_OTENC, (vq_u >= VQ_RU && vq_u % VQ_RU == 0) ? VQ_RB - VQ_RU : VQ_RB);
#else
    const int E = vq_min(VQ_OEO, VQ_RB);
#endif
    const int WR0 = WQ > VQ_RB ? WQ : VQ_RB;
    const int WR = WR0 > vq_st ? WR0 : vq_st;
    if (is_win) {
      t0 = WR - WQ;
    } else {
      const int lo0 = vq_min(vq_st, E);
      const int chunk = (E - lo0 + S - 2) / (S - 1);
      t0 = (s == S - 1) ? (E > vq_st ? E : vq_st) : vq_min(E, lo0 + s * chunk);
      t1 = (s == S - 1) ? WR : vq_min(E, t0 + chunk);
    }
  }
#undef VQ_RB
#undef VQ_RU
#undef VQ_OEO
#undef VQ_OTENC
