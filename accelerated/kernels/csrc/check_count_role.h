// encode.h's rows per (b, h) in a kernel where one role has an exact window and the other none (kernels/append.py
// MIXED): this scope's own (VQ_<role>_WIN), check_count_window.h or check_count.h.
#if VQ_SCOPE(WIN)
#include "check_count_window.h"
#else
#include "check_count.h"
#endif
