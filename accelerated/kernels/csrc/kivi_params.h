// KIVI steps 1-4 of one group from its min/max f_KP_LO, f_KP_HI (spec/methods/kivi.md): VQ_KP_S16, VQ_KP_Z16
// (TS) and their upcasts f_KP_S, f_KP_Z.

      const float f_m = ADD(f_KP_LO, 0.0f);
      const float f_mx = ADD(f_KP_HI, 0.0f);
      const TS VQ_KP_S16 = TO_TS(DIV(SUB(f_mx, f_m), f_lev));
      const TS VQ_KP_Z16 = TO_TS(f_m);
      const float f_KP_S = TO_F32(VQ_KP_S16);
      const float f_KP_Z = TO_F32(VQ_KP_Z16);
      bad_rule = bad_rule || !(ABS(f_KP_S) <= f_fmax) || !(ABS(f_KP_Z) <= f_fmax);
#undef f_KP_LO
#undef f_KP_HI
#undef VQ_KP_S16
#undef VQ_KP_Z16
#undef f_KP_S
#undef f_KP_Z
