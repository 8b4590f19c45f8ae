// One row's end, shared by the combine launch and the fused scalar combine: the values' inverse rotation of cy
// (cy2: turboquant_prod's sketch part), the window's partial (split S) merged in, the division by the total sum,
// the row written in the queries' dtype. Row r, its partials from row0, the encoded splits' max me and sum le.

  if (VROT) {
    // inverse RHT: H, s_d, signs (rotation.md); turboquant_prod first adds tau's inverse of the sketch part
    for (int pass = (VPARTS == 2 ? 0 : 1); pass < 2; ++pass) {
      VQ_COLD
      for (int hh = 1; hh < D; hh <<= 1) {
        vq_butterfly_stage<D>((pass == 0) ? cy2 : cy, 1, hh, CT, CNT);
        BARRIER();
      }
      for (int c = CT; c < D; c += CNT) {
        if (pass == 0) {
          cy[c] = cy[c] + cy2[c] * f_k[0] * f_vtau[h * D + c];
        } else {
          cy[c] = cy[c] * f_k[0] * f_vsig[h * D + c];
        }
      }
      BARRIER();
    }
  }
  // (d) the window's partial (split S), the division by the total sum, the row in the queries' dtype
  const float mw = o_ml[(row0 + S) * 2];
  const float lw = o_ml[(row0 + S) * 2 + 1];
  const float mt = vq_max(me, mw);
  const float we = (me == NEG_INF) ? 0.0f : vq_exp2(me - mt);
  const float ww = (mw == NEG_INF) ? 0.0f : vq_exp2(mw - mt);
  const int head = h * rep + r / L;
  const int pos = r % L;
  for (int c = CT; c < D; c += CNT) {
    const float o = (cy[c] * we + o_acc[(row0 + S) * VPARTS * D + c] * ww) / (le * we + lw * ww);
    out[(((int64_t)b * hq + head) * L + pos) * D + c] = static_cast<OT>(o);
  }
