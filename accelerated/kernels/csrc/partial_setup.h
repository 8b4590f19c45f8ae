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
#include "partial_setup_tokens.h"

#include "partial_setup_queries.h"

  // 2. code tables (rotation family: C1 or the sign table [+1, -1] in *tab1, C2 or the signs in *tab2; at
  //    most 4 bits per code, spec/formats.toml) in one register per lane: lane i holds entry i mod 2^B, and
  //    a lookup is a shuffle from lane `code` (a plain table in threadgroup memory measured the same on the
  //    H200; the byte tables before it put 32 random reads on 16 banks)
#define VQ_LOOKUP(reg, code) SHFL_IDX((reg), (int)(code))
  const float rk1 = f_ktab1[lane % (1 << KB1)];
  const float rk2 = f_ktab2[lane % (1 << KB2)];
  const float rv1 = f_vtab1[lane % (1 << VB1)];
  const float rv2 = f_vtab2[lane % (1 << VB2)];

