// The append kernel's body (accelerated/kernels/append.py), roles side by side: the first half of the threadgroups
// takes the keys, the second half the values, each half seeing itself as the whole grid (GROUP, NGROUPS, rebound
// here; regroup.h puts them back), so every threadgroup runs one scope, barriers included. One after the other in
// each threadgroup (append_serial.h), a decode step's append was two encode latency chains in a row.
  (void)after;
  const int vq_rgroups = (int)NGROUPS / 2;
  const bool vq_values = (int)GROUP >= vq_rgroups;
  const int vq_rgroup = (int)GROUP - (vq_values ? vq_rgroups : 0);
#undef GROUP
#undef NGROUPS
#define GROUP vq_rgroup
#define NGROUPS vq_rgroups
#define VQ_SHARED_PREFIX
#include "encode_shared.h"
  if (!vq_values) {
#define VQ_ROLE K
#include "encode_scope.h"
  } else {
#define VQ_ROLE V
#include "encode_scope.h"
  }
