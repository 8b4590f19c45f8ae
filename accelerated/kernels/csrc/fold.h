// f_FOLD_OUT = fold(f_FOLD_IN[0..D-1]) (number-model.md: the block fold, then the halving fold), the same value
// in every lane; f_FOLD_IN is clobbered. Parameters (macros the includer defines, consumed here; float data
// named f_* as the lint of tests/test_kernels_source.py expects): f_FOLD_IN, f_FOLD_OUT (the float it declares).

    for (int k = 1; k < RM; ++k) {              // block fold (RM > 1): blocks added left to right
      for (int e = 0; e < EN; ++e) {
        f_FOLD_IN[e] = ADD(f_FOLD_IN[e], f_FOLD_IN[k * EN + e]);
      }
    }
    for (int s = EN >> 1; s > 0; s >>= 1) {
      for (int e = 0; e < s; ++e) {
        f_FOLD_IN[e] = ADD(f_FOLD_IN[e], f_FOLD_IN[e + s]);
      }
    }
    float f_FOLD_OUT = f_FOLD_IN[0];
    for (int s = LW >> 1; s > 0; s >>= 1) {
      const float f_dn = SHFL_DOWN(f_FOLD_OUT, s);
      f_FOLD_OUT = ADD(f_FOLD_OUT, f_dn);
    }
    f_FOLD_OUT = SHFL(f_FOLD_OUT, 0);
#undef f_FOLD_IN
#undef f_FOLD_OUT
