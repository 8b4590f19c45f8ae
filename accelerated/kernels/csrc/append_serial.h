// The append kernel's body (accelerated/kernels/append.py), roles one after the other in every threadgroup: the
// keys' encode, then the values' (one set of threadgroup arrays: the two scopes never run at once).
  (void)after;
#define VQ_SHARED_PREFIX
#include "encode_shared.h"
#define VQ_ROLE K
#include "encode_scope.h"
  BARRIER();
#define VQ_ROLE V
#include "encode_scope.h"
