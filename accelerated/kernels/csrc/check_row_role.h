// encode.h's check-only row in a kernel where one role has an exact window and the other none (kernels/append.py
// MIXED): this scope's own (VQ_<role>_WIN), check_row_window.h or check_row.h.
#if VQ_SCOPE(WIN)
#include "check_row_window.h"
#else
#include "check_row.h"
#endif
