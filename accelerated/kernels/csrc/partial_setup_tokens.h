// partial_setup.h's token ranges: the window's rows R (each role's RK, RV in MIXED), T, this split's tokens t0 .. t1.
#if VQ_MIXED
  // MIXED (attention_source.py): each role's own window after this step (VQ_KWOWN / VQ_VWOWN: as VQ_WOWN), Q the
  // roles' common encoded prefix; one role's tokens Q .. QK - 1 (or QV - 1) are in its records, the other's window
  const int RK = (int)kw_shape[2] - VQ_KWOWN;
  const int RV = (int)vw_shape[2] - VQ_VWOWN;
  const int R = RK > RV ? RK : RV;
  const int QK = Q + R - RK;                      // the keys' encoded tokens
  const int QV = Q + R - RV;
  const int KWO = RK - vq_min(RK, RV);            // the window split's first row of each window
  const int VWO = RV - vq_min(RK, RV);
  const int WQ = Q + R - vq_min(RK, RV);          // the window split's first token: both roles exact from here
  // split S - 1 from QLO: every row this launch's append encodes (VQ_KTENC / VQ_VTENC of each role), and the
  // tokens of one role's records beside the other's window, up to WQ
  const int QLO = vq_min(QK - VQ_KTENC, QV - VQ_VTENC);
#else
  // no window: kw is a stand-in; VQ_WOWN: kw's first rows that are the chunk's own tokens encoded by this launch
  // (KIVI with window 0 at a flush: kw is the chunk's row the append writes, and the window after it is empty)
  const int R = HASWIN ? (int)kw_shape[2] - VQ_WOWN : 0;
  const int RK = R;
  const int RV = R;
  constexpr int KWO = 0;
  constexpr int VWO = 0;
  const int WQ = Q;
#endif
  const int T = Q + R;
  const bool is_win = (s == S);
  int t0 = 0;
  int t1 = vq_min(RK, RV);
#if VQ_MIXED && VQ_RAGGED
#include "partial_setup_mixed_ragged.h"
#elif VQ_MIXED
#include "partial_setup_mixed.h"
#elif VQ_RAGGED
  // a ragged KIVI batch (accelerated/cache/ragged.py): row b's encoded tokens end at its own boundary QR,
  // from its group phase rphase[b] (template RW: the windows' R, KG: the groups' G), at or past Q, the rows' least
  // boundary (where the window's rows start); its window rows from max(QR, its start) on
  const int vq_ph = (int)rphase[b];
  const int vq_u = T - RW - vq_ph;
  const int QR = vq_u >= 0 ? vq_ph + (vq_u / KG) * KG : 0;
  const int vq_st = (int)rstart[b];
  if (is_win) {
    t0 = (QR > vq_st ? QR : vq_st) - Q;
  } else {
#if VQ_RAGGED_APPEND
    // with the step's append inside: row b flushes a group where T - RW - its phase is a positive multiple of KG (its
    // boundary moved from QO to QR; append_block encoded it); split S - 1 takes that group from the row's start on
    // (empty where the row does not flush), splits 0 .. S - 2 its tokens before it
    const int QO = (vq_u >= KG && vq_u % KG == 0) ? QR - KG : QR;
    const int lo0 = vq_min(vq_st, QO);
    const int chunk = (QO - lo0 + S - 2) / (S - 1);
    t0 = (s == S - 1) ? vq_min(QR, QO > vq_st ? QO : vq_st) : vq_min(QO, lo0 + s * chunk);
    t1 = (s == S - 1) ? QR : vq_min(QO, t0 + chunk);
#else
    const int lo0 = vq_min(vq_st, QR);
    const int chunk = (QR - lo0 + S - 1) / S;
    t0 = vq_min(QR, lo0 + s * chunk);
    t1 = vq_min(QR, t0 + chunk);
#endif
  }
#else
  if (!is_win) {
    // APPEND: split S - 1 takes the VQ_TENC tokens it encoded (append_block), splits 0 .. S - 2 the ones before
    // row starts (a left-padded batch): batch row b attends to its tokens from rstart[b] on, split evenly
    const int QO = Q - VQ_TENC;
    const int SO = APPEND ? S - 1 : S;
    const int lo0 = VQ_STARTS ? vq_min((int)rstart[b], QO) : 0;
    const int chunk = (QO - lo0 + SO - 1) / SO;
    t0 = (APPEND && s == S - 1) ? QO : vq_min(QO, lo0 + s * chunk);
    t1 = (APPEND && s == S - 1) ? Q : vq_min(QO, t0 + chunk);
  }
#endif
#include "partial_setup_splits.h"
