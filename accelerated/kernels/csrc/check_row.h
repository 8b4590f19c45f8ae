// encode.h's check-only row i >= ne: x's token from + (i - ne), loaded (load_x.h) for its NaN/Inf check.
#define VQ_X_TOKEN from + (i - ne)
#include "load_x.h"
