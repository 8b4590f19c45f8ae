// A tensor-core loop's running state (tc_loop_setup.cuh, tc_kivi_setup.cuh, tc_affine_setup.cuh): row ra's query
// position, the online softmax's m_a / l_a, the value sums O^T's m-tiles and fv, their scale (P' = p * value norm *
// fv: set by the first chunk, lowered when a chunk's norms would take P' past 2^11, a power of two: O scaled with it).
  const int qpa = qpos[has_a ? ra : 0];
  float m_a = NEG_INF;
  float l_a = 0.0f;
  float fv = 0.0f;
  float o[MT][4];
  for (int mt = 0; mt < MT; ++mt) {
    for (int i = 0; i < 4; ++i) {
      o[mt][i] = 0.0f;
    }
  }
