// The lane layout and the code constants of the encode and decode bodies (source.py): d = RM * NB, lane l holds
// coordinates l + LW * e.

  constexpr int RM = D % 7 == 0 ? 28 : D % 5 == 0 ? 20 : D % 3 == 0 ? 12 : 1;   // m of d = m * 2^k
  constexpr int NB = D / RM;                    // n: the block length, a power of two
  constexpr int LW = NB < 32 ? NB : 32;         // lanes holding coordinates
  constexpr int E = D / LW;                     // coordinates per lane: j = lane + LW * e
  constexpr int EN = NB / LW;                   // slots per block: block k is slots k*EN .. k*EN+EN-1
  constexpr bool WHOLE = LW == 32 || LW == D;   // a slot's LW 1-bit codes are one whole packing word
  constexpr int WS = (D + 31) / 32;             // sign words per head
  const int lane = (int)LANE;
  const int warp = (int)WARP;
  const int nwarps = (int)NWARPS;
  const bool act = lane < LW;
  const uint32_t pin0 = (uint32_t)meta[0];
  // code widths, group size, KIVI role: meta[1..4], or template constants where a launch sets them (VQ_B1 =
  // B1 > 0, ...: the compiler specializes the packing, quantize and group loops; methods.SPECIALIZE_ROWS)
  const int bits = VQ_B1 > 0 ? VQ_B1 : meta[1];
  const int bits2 = VQ_B2 > 0 ? VQ_B2 : meta[2];
  const int gs = VQ_GS > 0 ? VQ_GS : meta[3];
  const int keys = VQ_KR >= 0 ? VQ_KR : meta[4];
  const float f_sd = f_k[0];
