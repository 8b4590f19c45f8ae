// A tensor-core loop's lane map (tc_loop_setup.cuh, tc_kivi_setup.cuh, tc_affine_setup.cuh): lane = 4 g + tig; score
// M row g / value N column g is part 0 (hi) or 1 (lo) of query row ra = g % 4, which has_a says exists.
  const int g = lane >> 2;
  const int tig = lane & 3;
  const int part = g >> 2;
  const int ra = g & 3;
  const bool has_a = ra < QB;
