// encode.h's rows per (b, h) in an encode scope with an exact window (encode_scope.h; kernels/append.py): the encoded
// ones (x: the window's oldest tokens, which leave it), then the chunk's tokens (VQ_<role>_WX), each checked and
// copied into the window (check_row_window.h). Scope parameters: WX (the chunk, B x H x t x d), W (the window after
// this step, B x H x R x d: a view of the stream's window buffer whose last t rows the chunk fills), XT (their type).
  const int per = ne + (int)VQ_SCOPE(WX_SHAPE)[2];
  const auto wx = VQ_SCOPE(WX);
  VQ_REF wx_strides = VQ_SCOPE(WX_STRIDES);
  auto wdst = VQ_MUT(VQ_SCOPE(XT), VQ_SCOPE(W));
  VQ_REF w_strides = VQ_SCOPE(W_STRIDES);
  const int vq_wrow = (int)VQ_SCOPE(W_SHAPE)[2] - (int)VQ_SCOPE(WX_SHAPE)[2];   // the window's row of chunk token 0
// KIVI with window 0: a flush encodes the window's G - 1 tokens and the chunk's own token (meta[7] of them, the last):
// load_x.h reads those from the chunk (the window buffer's row of it is the one this scope writes)
  const int vq_own = meta[7];
#define VQ_X_OWN
