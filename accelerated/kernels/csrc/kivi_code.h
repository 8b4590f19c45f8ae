// KIVI step 5: VQ_KC_OUT = 0 if S = 0, else rint(min(max((f_KC_VAL - Z) / S, 0), L)) (S, Z: f_KC_S, f_KC_Z).

      uint32_t VQ_KC_OUT = 0u;
      if (f_KC_S != 0.0f) {
        const float f_y = MINF(MAXF(DIV(SUB(f_KC_VAL, f_KC_Z), f_KC_S), 0.0f), f_lev);
        VQ_KC_OUT = (uint32_t)SUB(ADD(f_y, f_magic), f_magic);
      }
#undef f_KC_VAL
#undef f_KC_S
#undef f_KC_Z
#undef VQ_KC_OUT
