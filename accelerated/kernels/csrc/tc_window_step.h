// A scalar split's online softmax step (tc_window.h, tc_mixed_split.h): query row r's state wm / wl / wo takes the
// token of score dot (log2 domain) and value coordinates vv.
          const float mn = vq_max(wm[r], dot);
          const float al = (wm[r] == NEG_INF) ? 0.0f : vq_exp2(wm[r] - mn);
          const float p = vq_exp2(dot - mn);
          wl[r] = wl[r] * al + p;
          for (int j = 0; j < WJ; ++j) {
            wo[r][j] = wo[r][j] * al + p * vv[j];
          }
          wm[r] = mn;
