// Address spaces of an encode scope's pointers to its role's inputs (metal; VQ_TG: threadgroup memory).
#define VQ_DEV device
#define VQ_TG threadgroup
#define VQ_REF const auto
#define VQ_MUT(type, p) const_cast<device type*>(p)
