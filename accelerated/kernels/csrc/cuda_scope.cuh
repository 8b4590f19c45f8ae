// Address spaces of an encode scope's pointers to its role's inputs (cuda; VQ_TG: threadgroup memory).
#define VQ_DEV
#define VQ_TG
#define VQ_REF const auto&
#define VQ_MUT(type, p) const_cast<type*>(p)
