// The exact windows passed whole (tuning's whole_windows: kernels/append.py, attention_source.py): each role's window
// buffer (kwb, vwb: B x H x rows x d, row-contiguous) and wrow, int32 [kf row, kf rows, kw row, kw rows] per role (keys
// 0..3, values 4..7), each row relative to the role's count (VQ_WB_KCOUNT, VQ_WB_VCOUNT), so that a plan's arrays
// repeat from step to step. Binds the names the bodies read (kf: the tokens leaving the window, kw: the window) to
// those rows, as the views of the stream's buffer the launch would otherwise take: a row offset each (a register),
// the pointers as expressions of the buffer's (kernel parameters), so the binding holds no 64-bit pointer live.
// Parameters: VQ_WB_K / VQ_WB_V (the role's kw bound), VQ_WB_KF / VQ_WB_VF (its kf too), VQ_WB_KCOUNT /
// VQ_WB_VCOUNT (expressions).
#if VQ_WB_K
  const int vq_kwo = VQ_WB_KCOUNT + (int)wrow[2];
  const int kw_shape[4] = {(int)kwb_shape[0], (int)kwb_shape[1], (int)wrow[3], (int)kwb_shape[3]};
#define kw (kwb + (int64_t)vq_kwo * kwb_strides[2])
#define kw_strides kwb_strides
#endif
#if VQ_WB_KF
  const int vq_kfo = VQ_WB_KCOUNT + (int)wrow[0];
  const int kf_shape[4] = {(int)kwb_shape[0], (int)kwb_shape[1], (int)wrow[1], (int)kwb_shape[3]};
#define kf (kwb + (int64_t)vq_kfo * kwb_strides[2])
#define kf_strides kwb_strides
#endif
#if VQ_WB_V
  const int vq_vwo = VQ_WB_VCOUNT + (int)wrow[6];
  const int vw_shape[4] = {(int)vwb_shape[0], (int)vwb_shape[1], (int)wrow[7], (int)vwb_shape[3]};
#define vw (vwb + (int64_t)vq_vwo * vwb_strides[2])
#define vw_strides vwb_strides
#endif
#if VQ_WB_VF
  const int vq_vfo = VQ_WB_VCOUNT + (int)wrow[4];
  const int vf_shape[4] = {(int)vwb_shape[0], (int)vwb_shape[1], (int)wrow[5], (int)vwb_shape[3]};
#define vf (vwb + (int64_t)vq_vfo * vwb_strides[2])
#define vf_strides vwb_strides
#endif
