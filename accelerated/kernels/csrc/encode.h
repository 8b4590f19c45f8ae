// The encode kernel's body (accelerated/kernels/source.py has the conventions: lanes, macros, template
// constants M, D, TS), shared by CUDA and Metal after a prelude (<backend>_prelude, <backend>_encode_ops).
// Needs VQ_H12 .. VQ_H28 (H_m's rows, spec/formats.toml: the loader defines them); VQ_ENCODE_ARRAYS, its threadgroup
// arrays: encode_arrays.h in the encode kernel, encode_arrays_scoped.h in a scope of a bigger kernel; VQ_CHECK_COUNT and
// VQ_CHECK_ROW, its check-only tokens: check_count.h and check_row.h (x's tokens from..nt-1), or check_count_window.h
// and check_row_window.h (a scope's chunk, copied into its exact window: kernels/append.py with a window).
#include "common.h"
#define VQ_HM12 VQ_H12
#define VQ_HM20 VQ_H20
#define VQ_HM28 VQ_H28
#include "hadamard.h"
// KIVI keys' output rows: their scale / zero rows (a group of gs tokens each) and their codes rows (one per token);
// an encode scope maps them into the streams' buffers (encode_scope.h)
#ifndef VQ_GROW
#define VQ_GROW(bh, ne, i) VQ_OROW(bh, ne, i)
#endif
#ifndef VQ_TROW
#define VQ_TROW(bh, nq, t) ((bh) * (nq) + (t))
#endif

#include VQ_ENCODE_ARRAYS
  if (M <= 3 && M != 2 && warp == 0) {
    const int k = lane & 15;
    const bool two = lane >= 16;
    float f_t = 0.0f;
    if (!two && k < (1 << bits) - 1) {
      f_t = f_b1[k];
    }
    if (two && M == 1 && k < (1 << bits2) - 1) {
      f_t = f_b2[k];
    }
    f_tq[lane] = f_t;
  }
  BARRIER();
  const int nq = meta[5];                       // tokens to encode: 0..nq-1
  const int lo = meta[6];                       // tokens lo..T-1 are checked for NaN/Inf too
  const float f_lev = f_k[5];
  const float f_magic = f_k[3];
  const float f_fmax = f_k[6];
  const int nb = x_shape[0];
  const int nh = x_shape[1];
  const int nt = x_shape[2];
  const int64_t xs0 = x_strides[0];
  const int64_t xs1 = x_strides[1];
  const int64_t xs2 = x_strides[2];
  const int64_t xs3 = x_strides[3];
  const int from = nq > lo ? nq : lo;           // first check-only token
  const int ne = (M == 4 && keys != 0) ? nq / gs : nq;   // encode rows per (b, h)
#include VQ_CHECK_COUNT
  const int rows = nb * nh * per;
  bool bad_x = false;
  bool bad_rule = false;
#define VQ_ROWS_PER per
#define VQ_ROWS_N rows
#include "rows.h"

    const int64_t xrow = (int64_t)b * xs0 + (int64_t)h * xs1;
    // row of the outputs (kernels/append.py: of the buffers); KIVI keys' rows i are groups, their scale and zero
    // rows (VQ_GROW), their codes one row per token (VQ_TROW)
    const int orow = (M == 4 && keys != 0) ? VQ_GROW(bh, ne, i) : VQ_OROW(bh, ne, i);
    if (i >= ne) {
      // a token that is only checked (window tokens of a one-shot encode, a chunk's unflushed tokens)
#include VQ_CHECK_ROW

#ifdef VQ_ROW_ENCODES
    } else if (VQ_ROW_ENCODES(b)) {     // (a ragged launch: only the rows whose group flushes now encode it)
#else
    } else {
#endif
#include "encode_rotation.h"
#include "encode_kivi_keys.h"
#include "encode_groups.h"
    }
#include "rows_end.h"

#include "encode_faults.h"
