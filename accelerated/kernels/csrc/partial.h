// The attention `partial` kernel's body (accelerated/kernels/attention_source.py): setup, the loop over a split's
// tokens (VQ_PARTIAL_LOOP: partial_loop.h, or tc_loop.cuh on tensor cores), the split's output, the fused combine.
#include "partial_setup.h"
#include VQ_PARTIAL_LOOP
#include "partial_output.h"
#include "partial_combine.h"
