// encode_groups.h's mlx_affine steps 2-6: f_lo / f_hi (a group's min, max) become its bias and scale.
      if (M == 5) {
        // mlx_affine steps 2-6 (spec/methods/mlx_affine.md), once per group at its first slot (later slots
        // of the group copy them); f_lo / f_hi then hold the group's bias and scale
        for (int e = 0; e < E; ++e) {
          if (e % gsl == 0) {
            const bool flip = ABS(f_lo[e]) > ABS(f_hi[e]);
            const float f_span = SUB(f_hi[e], f_lo[e]);
            bad_rule = bad_rule || f_span > f_fmax;
            const float f_s0 = MAXF(DIV(f_span, f_lev), f_k[4]);
            const float f_s = flip ? f_s0 : NEG(f_s0);
            const float f_edge = flip ? f_lo[e] : f_hi[e];
            // q0 = rint(edge / s) for any magnitude: |v| >= 2^23 is an integer already
            const float f_t = DIV(f_edge, f_s);
            const float f_ta = ABS(f_t);
            const float f_tr = SUB(ADD(f_ta, f_k[2]), f_k[2]);
            const float f_q0 = f_ta < f_k[2] ? (f_t < 0.0f ? NEG(f_tr) : f_tr) : f_t;
            const bool nz = f_q0 != 0.0f;
            f_hi[e] = nz ? DIV(f_edge, f_q0) : f_s;
            f_lo[e] = nz ? f_edge : 0.0f;
          } else {
            f_hi[e] = f_hi[e > 0 ? e - 1 : 0];
            f_lo[e] = f_lo[e > 0 ? e - 1 : 0];
          }
        }
      }
