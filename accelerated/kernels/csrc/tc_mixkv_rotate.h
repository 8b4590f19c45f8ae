// tc_mixkv_token.h's VQ_MT_ROTATE(A): this lane's coordinates A[j] (c = lane + 32 j) of an exact value rotated into
// the values' domain as partial_loop_values_exact.h's VQ_ROTATE does (signs, H by butterflies, s_d), in this layout:
// stages below 32 across lanes (shuffles: every lane of the warp takes them), the others within a lane's j.
#define VQ_MT_ROTATE(A) \
      for (int j_ = 0; j_ < WJ; ++j_) { \
        A[j_] = A[j_] * f_vsig[h * D + lane + 32 * j_]; \
      } \
      for (int hh_ = 1; hh_ < 32 && hh_ < D; hh_ <<= 1) { \
        const bool up_ = (lane & hh_) != 0; \
        for (int j_ = 0; j_ < WJ; ++j_) { \
          const float o_ = SHFL_XOR(A[j_], hh_); \
          A[j_] = up_ ? o_ - A[j_] : A[j_] + o_; \
        } \
      } \
      for (int kh_ = 1; kh_ < WJ; kh_ <<= 1) { \
        for (int j_ = 0; j_ < WJ; ++j_) { \
          if ((j_ & kh_) == 0) { \
            const float a_ = A[j_]; \
            const float b_ = A[j_ + kh_]; \
            A[j_] = a_ + b_; \
            A[j_ + kh_] = a_ - b_; \
          } \
        } \
      } \
      for (int j_ = 0; j_ < WJ; ++j_) { \
        A[j_] = A[j_] * f_k[0]; \
      }
