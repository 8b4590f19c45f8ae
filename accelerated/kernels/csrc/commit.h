// The commit kernel's head (accelerated/kernels/commit.py): threadgroup row y < VQ_NWRITES copies write y
// (commit_write.h), the next rows evaluate the checks (commit_check.h); block columns of VQ_NT threads stride over
// the elements; commit_end.h writes the token. VQ_AFTER: the launch takes the previous commit's token `after`.
  const int tid = (int)TID;
  const int which = (int)GROUP_Y;
  const int col = (int)GROUP_X;
  const int ncol = (int)NGROUPS_X;
  SHARED(uint32_t, hit, VQ_NT);
  uint32_t mine = 0u;
#if VQ_AFTER
  (void)after;                            // only orders this launch after the previous commit
#endif
