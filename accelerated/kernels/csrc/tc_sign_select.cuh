// tuning's tc_sign_select (the launch's header defines VQ_SIGN_SELECT): prod's QJL signs looked up without a warp
// shuffle. Their table is [+1, -1] (attention.py _sign_table), so an entry, vq_h2(+-1, 0), is float16 1.0 (0x3C00) with
// the code bit as its sign bit: no register held, the same entries (VQ_E2K: tc_two_entries.cuh; VQ_TAB_tabv2:
// tc_ventries.cuh). rvq's second stream keeps its shuffles.
#if defined(VQ_SIGN_SELECT)
#define VQ_E2K(x) ((MK == 3) ? (0x3C00u | (((x) & 1u) << 15)) : SHFL_IDX(tabk2, (x)))
#define VQ_TAB_tabv2(x) ((MV == 3) ? (0x3C00u | (((x) & 1u) << 15)) : SHFL_IDX(tabv2, (x)))
#else
#define VQ_E2K(x) SHFL_IDX(tabk2, (x))
#define VQ_TAB_tabv2(x) SHFL_IDX(tabv2, (x))
#endif
