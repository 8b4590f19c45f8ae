// After append_apart.h: GROUP and NGROUPS back to the prelude's (the includer appends <backend>_grid), for text
// after the kernel (the compile checks write several kernels into one file).
#undef GROUP
#undef NGROUPS
