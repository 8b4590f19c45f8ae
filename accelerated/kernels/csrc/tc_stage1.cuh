// tc_loop.cuh's loads with one code stream per role: the second stream's (tc_two_setup.cuh) expand to nothing.
#define TC_KEYS2(T, W)
#define TC_VALUES2(T, W)
#define TC_KNORM2(T, N)
#define TC_VNORM2(T, N)
