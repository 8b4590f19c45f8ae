// partial_setup_tokens.h's token ranges of a MIXED partial over ragged rows (VQ_RAGGED: accelerated/cache/ragged.py):
// the values (KIVI; template RW: their R, VG: their G) end their encoded tokens at row b's own boundary QVR, from its
// group phase, at or past QV (where their window's rows start); the keys are per token (phase 0): every row's at QK.
  const int vq_ph = (int)rphase[b];
  const int vq_u = T - RW - vq_ph;
  const int QVR = vq_u >= 0 ? vq_ph + (vq_u / VG) * VG : 0;
  {
    // row b: splits 0 .. S - 2 its tokens from its start that both roles hold encoded (up to E), split S - 1 those
    // one role holds exact (keys' window, values' window past QVR) up to WR, the window split from WR: both exact
    const int vq_st = (int)rstart[b];
#if VQ_RAGGED_APPEND
    // with the step's append inside: what it encodes (the keys' token, a flushing row's values group, from QVR - VG)
    // goes to split S - 1, which wrote it
    const int E = vq_min(QK - VQ_KTENC, (vq_u >= VG && vq_u % VG == 0) ? QVR - VG : QVR);
#else
    const int E = vq_min(QK, QVR);
#endif
    const int WR0 = WQ > QVR ? WQ : QVR;
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
