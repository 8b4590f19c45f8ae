// A chunk's token (append.py's layout, (2 roles, groups, 2): an APPEND partial's, one group per batch and KV head, or
// the append kernel's, one per threadgroup) ORed over the groups into `summary`, (2, 1, 2): the chunk's four checks,
// the append kernel's token of one group. The host reads only this: 4 bytes, which MLX's CUDA allocator keeps in its
// managed scalar pool. A host read of the token itself (32 bytes for 8 KV heads: device memory) moved it into a fresh
// managed allocation which MLX later recycled as a kernel's output, and the GPU's first write to it stalled the step
// by 70-250 us (H200, tools/gpu_timeline.py: once per step, at the first partial that reused it).

  if ((int)BLOCK_X == 0 && (int)BLOCK_Y == 0 && (int)BLOCK_Z == 0 && (int)TID < 4) {
    const int ng = (int)tok_shape[1];
    bool hit = false;
    for (int g = 0; g < ng; ++g) {
      hit = hit || tok[((int)TID / 2 * ng + g) * 2 + (int)TID % 2];
    }
    summary[(int)TID] = hit;
  }
