// The end of rows.h's loop: the next segment, (h, b) with carries.

  }
    ui = 0u;                                    // the next segment: (h, b) with carries
    ubh += 1u;
    uh += 1u;
    if (uh == unh) {
      uh = 0u;
      ub += 1u;
    }
    r0 = rs;
  }
