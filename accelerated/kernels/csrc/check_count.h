// encode.h's rows per (b, h): the encoded ones, then x's check-only tokens from..nt-1.
  const int per = ne + (nt - from);
