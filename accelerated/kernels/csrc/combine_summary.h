// A chunk's token (append.py's layout) ORed over its groups into `summary`, (2, 1, 2): the chunk's four checks
// (attention_source.py says why the host reads only this).

  if ((int)BLOCK_X == 0 && (int)BLOCK_Y == 0 && (int)BLOCK_Z == 0 && (int)TID < 4) {
    const int ng = (int)tok_shape[1];
    bool hit = false;
    for (int g = 0; g < ng; ++g) {
      hit = hit || tok[((int)TID / 2 * ng + g) * 2 + (int)TID % 2];
    }
    summary[(int)TID] = hit;
  }
