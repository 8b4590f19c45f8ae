// The scalar loop's helpers for a MIXED partial (attention_source.MIXED_WINDOWS; partial_loop.h): record rows clamped
// to a role's encoded ones, and the rotation of an exact token into its role's domain.
#if VQ_MIXED
  // MIXED: split S - 1's tokens past a role's encoded ones (QK, QV) are that role's window rows, exact, rotated into
  // its domain as the queries are (signs, H by butterflies across the lanes' chunks, s_d: the combine's inverse
  // takes the values back); their record rows are clamped to readable ones and never used
#if VQ_RAGGED
// (VQ_RKEYS, ragged texts only: KIVI keys of the row's own phase, their records to its boundary QKR; QVR = QV then)
#define VQ_KROW(t) ((t) < VQ_QKR ? (t) : (VQ_QKR > 0 ? VQ_QKR - 1 : 0))
#define VQ_VROW(t) ((t) < QVR ? (t) : (QVR > 0 ? QVR - 1 : 0))
#else
#define VQ_KROW(t) ((t) < QK ? (t) : (QK > 0 ? QK - 1 : 0))
#define VQ_VROW(t) ((t) < QV ? (t) : (QV > 0 ? QV - 1 : 0))
#endif
#define VQ_ROTATE(A, SIG)   for (int c_ = 0; c_ < NC; ++c_) {     A[c_] = A[c_] * SIG[h * D + (lp + (c_ / 8) * P) * 8 + c_ % 8];   }   for (int hh_ = 1; hh_ < D; hh_ <<= 1) {     if (hh_ < 8) {       for (int c_ = 0; c_ < NC; ++c_) {         if ((c_ & hh_) == 0) {           const float a_ = A[c_];           const float b_ = A[c_ + hh_];           A[c_] = a_ + b_;           A[c_ + hh_] = a_ - b_;         }       }     } else if (hh_ < 8 * P) {       const bool up_ = (lp & (hh_ / 8)) != 0;       for (int c_ = 0; c_ < NC; ++c_) {         const float o_ = SHFL_XOR(A[c_], hh_ / 8);         A[c_] = up_ ? o_ - A[c_] : A[c_] + o_;       }     } else {       const int kh_ = 8 * (hh_ / (8 * P));       for (int c_ = 0; c_ < NC; ++c_) {         if ((c_ & kh_) == 0) {           const float a_ = A[c_];           const float b_ = A[c_ + kh_];           A[c_] = a_ + b_;           A[c_ + kh_] = a_ - b_;         }       }     }   }   for (int c_ = 0; c_ < NC; ++c_) {     A[c_] = A[c_] * f_k[0];   }
#else
#define VQ_KROW(t) (t)
#define VQ_VROW(t) (t)
#endif
