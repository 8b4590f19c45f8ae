// The encode body's end: the warps' fault flags (bad_x, bad_rule) ORed into one slot per threadgroup of fault.
  // fault flags: warp vote, then one slot per threadgroup (every warp gets here: no early return)
  const bool any_x = ANY(bad_x);
  const bool any_rule = ANY(bad_rule);
  if (lane == 0) {
    flt[2 * warp] = any_x ? 1u : 0u;
    flt[2 * warp + 1] = any_rule ? 1u : 0u;
  }
  BARRIER();
  if (lane == 0 && warp == 0) {
    uint32_t fx = 0u;
    uint32_t fr = 0u;
    for (int w = 0; w < nwarps; ++w) {
      fx |= flt[2 * w];
      fr |= flt[2 * w + 1];
    }
    fault[2 * GROUP] = fx != 0u;
    fault[2 * GROUP + 1] = fr != 0u;
  }
