// Steps 1-2 of the attention `partial` kernel (accelerated/kernels/attention_source.py): the split's tokens, the
// group's query rows scaled and rotated into the keys' domain, the code tables in registers.

  constexpr int NW = NT / 32;             // warps
  constexpr int TPW = 32 / P;             // token slots per warp
  constexpr int TPI = NW * TPW;           // tokens per iteration of the block
  constexpr int NCH = D / (8 * P);        // 8-coordinate chunks per lane
  constexpr int NC = NCH * 8;             // coordinates per lane
  constexpr bool KROT = MK <= 3;          // keys in the rotated domain
  constexpr bool VROT = MV <= 3;
  constexpr int KPARTS = (MK == 3) ? 2 : 1;
  constexpr int VPARTS = (MV == 3) ? 2 : 1;
  const int tid = (int)TID;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int slot = lane / P;
  const int lp = lane % P;
  const int s = (int)BLOCK_X;
  const int S = (int)NBLOCK_X - 1;        // encoded splits; split S is the window
  const int h = (int)BLOCK_Y;
  const int nqg = (int)NBLOCK_Z / (int)q_shape[0];
  const int b = (int)BLOCK_Z / nqg;
  const int qg = (int)BLOCK_Z % nqg;
  const int hkv = (int)NBLOCK_Y;
  const int hq = (int)q_shape[1];
  const int L = (int)q_shape[2];
  const int rep = hq / hkv;
  const int nq = rep * L;
  const int Q = nenc[0];                          // encoded tokens (the code buffers may hold more rows)
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
#if VQ_MIXED
  if (!is_win) {
    const int SO = S - 1;
    const int lo0 = VQ_STARTS ? vq_min((int)rstart[b], QLO) : 0;
    const int chunk = (QLO - lo0 + SO - 1) / SO;
    t0 = (s == S - 1) ? QLO : vq_min(QLO, lo0 + s * chunk);
    t1 = (s == S - 1) ? WQ : vq_min(QLO, t0 + chunk);
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

  // 1. the group's query rows, scaled (log2 domain), rotated into the keys' domain (encoded splits)
  SHARED(float, sq, QB * D);
  SHARED(float, sq2, QB * D);
  VQ_COLD
  for (int i = tid; i < QB * D; i += NT) {
    const int r = qg * QB + i / D;
    float v = 0.0f;
    if (r < nq) {
      const int head = h * rep + r / L;
      const int pos = r % L;
      v = static_cast<float>(q[(int64_t)b * q_strides[0] + (int64_t)head * q_strides[1]
                               + (int64_t)pos * q_strides[2] + (int64_t)(i % D) * q_strides[3]]) * f_scale[0];
      if (KROT && !is_win) {
        v = v * f_ksig[h * D + i % D];
      }
    }
    sq[i] = v;
  }
  BARRIER();
  if (KROT && !is_win) {
    // H by ascending butterfly stages, then s_d (rotation.md); tau's RHT on top for turboquant_prod
    for (int pass = 0; pass < KPARTS; ++pass) {
      if (pass == 1) {
        VQ_COLD
        for (int i = tid; i < QB * D; i += NT) {
          sq2[i] = sq[i] * f_ktau[h * D + i % D];
        }
        BARRIER();
      }
      TGMEM float* rows = (pass == 0) ? sq : sq2;
      VQ_COLD
      for (int hh = 1; hh < D; hh <<= 1) {
        vq_butterfly_stage<D>(rows, QB, hh, tid, NT);
        BARRIER();
      }
      VQ_COLD
      for (int i = tid; i < QB * D; i += NT) {
        rows[i] = rows[i] * f_k[0];
      }
      BARRIER();
    }
  }
  float qr[QB][NC];
  float qr2[KPARTS == 2 ? QB : 1][KPARTS == 2 ? NC : 1];
  for (int r = 0; r < QB; ++r) {
    for (int k = 0; k < NCH; ++k) {
      for (int j = 0; j < 8; ++j) {
        const int c = (lp + k * P) * 8 + j;
        qr[r][k * 8 + j] = sq[r * D + c];
        if (KPARTS == 2) {
          qr2[r % (KPARTS == 2 ? QB : 1)][(k * 8 + j) % (KPARTS == 2 ? NC : 1)] = sq2[r * D + c];
        }
      }
    }
  }
  // causal: query row r sits at position T - L + r % L and sees tokens at positions <= it
  int qpos[QB];
  for (int r = 0; r < QB; ++r) {
    qpos[r] = CAUSAL ? (T - L + (qg * QB + r) % L) : T;
  }

  // 2. code tables (rotation family: C1 or the sign table [+1, -1] in *tab1, C2 or the signs in *tab2; at
  //    most 4 bits per code, spec/formats.toml) in one register per lane: lane i holds entry i mod 2^B, and
  //    a lookup is a shuffle from lane `code` (a plain table in threadgroup memory measured the same on the
  //    H200; the byte tables before it put 32 random reads on 16 banks)
#define VQ_LOOKUP(reg, code) SHFL_IDX((reg), (int)(code))
  const float rk1 = f_ktab1[lane % (1 << KB1)];
  const float rk2 = f_ktab2[lane % (1 << KB2)];
  const float rv1 = f_vtab1[lane % (1 << VB1)];
  const float rv2 = f_vtab2[lane % (1 << VB2)];

