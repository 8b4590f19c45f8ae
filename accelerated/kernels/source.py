"""Kernel source text: one body per kernel, shared by CUDA and Metal, plus a thin prelude per backend
(spec/number-model.md, rotation.md, codebooks.md, packing.md, methods/turboquant*.md, rabitq.md).

The bodies are written against a handful of macros that each prelude defines:
- indices: TID (thread in the threadgroup = coordinate j), TOKEN, HEAD, BATCH (the threadgroup's position:
  token, local head, batch), NTOK and NHEAD (threadgroups along x and y: Q and H); SHARED(type, name, n) declares threadgroup/shared memory; BARRIER() syncs the group.
- exact float arithmetic: ADD SUB MUL DIV SQRT (one binary32 op, RNE, never contracted), NEG and ABS
  (sign-bit ops, exact), TO_F32 (exact upcast of the input element).
Float variables and float arrays are named `f_*` so a lint can check that every float operation goes
through a helper (tests/test_kernels_source.py).

Why the shape of the bodies: one threadgroup per token and one thread per coordinate (d = 16..1024). Both
operands of every butterfly and fold step are read back from threadgroup memory after a barrier, so no
product can be contracted into the following add even by a compiler that contracts across statements
(Metal); the residual u of the two-stage methods is routed the same way (PIN).
"""
from __future__ import annotations

# Method ids (the kernels' template argument M).
METHOD_IDS = {"turboquant": 0, "turboquant_rvq": 1, "rabitq": 2, "turboquant_prod": 3}

ENCODE_INPUTS = ["x", "f_sig", "f_tau", "f_c1", "f_b1", "f_c2", "f_b2", "f_k", "meta"]
ENCODE_OUTPUTS = ["codes1", "codes2", "f_norm", "f_aux"]
DECODE_INPUTS = ["codes1", "codes2", "f_norm", "f_aux", "f_sig", "f_tau", "f_c1", "f_c2", "f_k", "meta"]
DECODE_OUTPUTS = ["f_out"]

# Shared fragments of the two bodies (plain text substitution, so both bodies stay one source each).
_HEADER_PART = """
  // threadgroup (TOKEN, HEAD, BATCH) of a grid of NTOK tokens x NHEAD heads; meta = [d, bits, bits2];
  // f_k = [s_d, A_d]
  const int j = (int)TID;
  const int tok = (int)TOKEN;
  const int h = (int)HEAD;
  const int nq = (int)NTOK;
  const int nh = (int)NHEAD;
  const int d = meta[0];
  const int bits = meta[1];
  const int bits2 = meta[2];
  const int64_t tix = ((int64_t)BATCH * nh + h) * nq + tok;
  const int sgn = h * d + j;
  SHARED(float, f_red, 1024);
  SHARED(float, f_buf, 2048);
  int sb = 0;
"""

# H (rotation.md): ascending stages h = 1, 2, ..., d/2. Double-buffered: stage writes go to the half
# the previous stage did not read, so one barrier per stage suffices; both operands come from memory.
_BUTTERFLY = """
  for (int hh = 1; hh < d; hh <<= 1) {
    f_buf[sb + j] = f_v;
    BARRIER();
    const float f_lo = f_buf[sb + (j & ~hh)];
    const float f_hi = f_buf[sb + (j | hh)];
    f_v = ((j & hh) == 0) ? ADD(f_lo, f_hi) : SUB(f_lo, f_hi);
    sb = 1024 - sb;
  }
"""

# Halving fold (number-model.md) of f_red[0..d-1], in place; the result is f_red[0] for every thread.
_FOLD = """
  BARRIER();
  for (int n = d >> 1; n > 0; n >>= 1) {
    if (j < n) {
      f_red[j] = ADD(f_red[j], f_red[j + n]);
    }
    BARRIER();
  }
"""


def _pack(codes: str, bits: str, out: str) -> str:
    """Words assembled by threads j < W from codes staged in threadgroup memory (packing.md)."""
    return f"""
  BARRIER();
  {{
    const int per = 32 / {bits};
    const int nw = (d + per - 1) / per;
    if (j < nw) {{
      uint32_t word = 0u;
      for (int s = 0; s < per; ++s) {{
        const int jj = j * per + s;
        if (jj < d) {{
          word |= {codes}[jj] << ({bits} * s);
        }}
      }}
      {out}[tix * nw + j] = word;
    }}
  }}
"""


def _count(val: str, table: str, nb: str, out: str) -> str:
    """quantize(val; table) = number of strict crossings (codebooks.md)."""
    return f"""
  uint32_t {out} = 0u;
  for (int k = 0; k < {nb}; ++k) {{
    const uint32_t cross = ({val} > {table}[k]) ? 1u : 0u;
    {out} += cross;
  }}
"""


ENCODE_BODY = (
    _HEADER_PART
    + """
  SHARED(uint32_t, cst1, 1024);
  SHARED(uint32_t, cst2, 1024);
  // 1. exact upcast (x is read through its strides: windows and views need no copy)
  const int64_t xoff = (int64_t)BATCH * x_strides[0] + (int64_t)h * x_strides[1]
                     + (int64_t)tok * x_strides[2] + (int64_t)j * x_strides[3];
  const float f_x = TO_F32(x[xoff]);
  // 2. n = sqrt(fold(x * x)); squares go through memory before the fold
  f_red[j] = MUL(f_x, f_x);
"""
    + _FOLD
    + """
  const float f_n = SQRT(f_red[0]);
  // 3. r = 1 / n or 0
  const float f_r = (f_n > 0.0f) ? DIV(1.0f, f_n) : 0.0f;
  // 4. y = RHT(x): sign flip, butterfly, scale
  float f_v = MUL(f_x, f_sig[sgn]);
"""
    + _BUTTERFLY
    + """
  const float f_y = MUL(f_v, f_k[0]);
  if (j == 0) {
    f_norm[tix] = f_n;
  }
  if (M == 2) {
    // rabitq: a = fold(|y|); ip = (a * s_d) * r; q = y < 0
    f_red[j] = ABS(f_y);
"""
    + _FOLD
    + """
    if (j == 0) {
      f_aux[tix] = MUL(MUL(f_red[0], f_k[0]), f_r);
    }
    cst1[j] = (f_y < 0.0f) ? 1u : 0u;
"""
    + _pack("cst1", "1", "codes1")
    + """
  } else {
    // 5. u = y * r, pinned in memory before the residual subtract
    f_buf[sb + j] = MUL(f_y, f_r);
    BARRIER();
    const float f_u = f_buf[sb + j];
    sb = 1024 - sb;
    // 6. i = quantize(u; B1_d)   (prod: the (bits-1)-bit table is passed as c1/b1)
    const int nb1 = (1 << bits) - 1;
"""
    + _count("f_u", "f_b1", "nb1", "ci")
    + """
    cst1[j] = ci;
"""
    + _pack("cst1", "bits", "codes1")
    + """
    if (M == 1) {
      // rvq: e = u - C1[i]; k = quantize(e; B2_d)
      const float f_e = SUB(f_u, f_c1[ci]);
      const int nb2 = (1 << bits2) - 1;
"""
    + _count("f_e", "f_b2", "nb2", "ck")
    + """
      cst2[j] = ck;
"""
    + _pack("cst2", "bits2", "codes2")
    + """
    }
    if (M == 3) {
      // prod: e = u - C[i]; gamma = sqrt(fold(e * e)); w = RHT(e) with tau; q = w < 0
      const float f_e = SUB(f_u, f_c1[ci]);
      f_red[j] = MUL(f_e, f_e);
"""
    + _FOLD
    + """
      if (j == 0) {
        f_aux[tix] = SQRT(f_red[0]);
      }
      f_v = MUL(f_e, f_tau[sgn]);
"""
    + _BUTTERFLY
    + """
      const float f_w = MUL(f_v, f_k[0]);
      cst2[j] = (f_w < 0.0f) ? 1u : 0u;
"""
    + _pack("cst2", "1", "codes2")
    + """
    }
  }
"""
)


def _unpack(words: str, bits: str, out: str) -> str:
    """c_j = (word[j div k] >> (b * (j mod k))) & (2^b - 1) (packing.md)."""
    return f"""
  uint32_t {out};
  {{
    const int per = 32 / {bits};
    const int nw = (d + per - 1) / per;
    {out} = ({words}[tix * nw + j / per] >> ({bits} * (j % per))) & ((1u << {bits}) - 1u);
  }}
"""


DECODE_BODY = (
    _HEADER_PART
    + _unpack("codes1", "bits", "ci")
    + """
  const float f_n = f_norm[tix];
  float f_v = 0.0f;
  if (M == 0) {
    // y^ = C_d[i] * n
    f_v = MUL(f_c1[ci], f_n);
  }
  if (M == 1) {
    // y^ = (C1_d[i] + C2_d[k]) * n: add, then multiply
"""
    + _unpack("codes2", "bits2", "ck")
    + """
    f_v = MUL(ADD(f_c1[ci], f_c2[ck]), f_n);
  }
  if (M == 2) {
    // g = (n * s_d) / ip if ip > 0 else 0; y^ = -g if q = 1 else g
    const float f_ip = f_aux[tix];
    const float f_g = (f_ip > 0.0f) ? DIV(MUL(f_n, f_k[0]), f_ip) : 0.0f;
    f_v = (ci == 1u) ? NEG(f_g) : f_g;
  }
  if (M == 3) {
    // s = -1 / +1 from the QJL bit; t = RHT_inverse(s) with tau; e^ = t * (gamma * A_d);
    // u^ = C_d[i] + e^ (e^ pinned in memory first); y^ = u^ * n
"""
    + _unpack("codes2", "1", "cq")
    + """
    f_v = (cq == 1u) ? NEG(1.0f) : 1.0f;
"""
    + _BUTTERFLY
    + """
    const float f_t = MUL(MUL(f_v, f_k[0]), f_tau[sgn]);
    const float f_g = MUL(f_aux[tix], f_k[1]);
    f_red[j] = MUL(f_t, f_g);
    BARRIER();
    f_v = MUL(ADD(f_c1[ci], f_red[j]), f_n);
  }
  // x^ = RHT_inverse(y^): butterfly, scale, sign flip
"""
    + _BUTTERFLY
    + """
  f_out[tix * d + j] = MUL(MUL(f_v, f_k[0]), f_sig[sgn]);
"""
)

BODIES = {"encode": ENCODE_BODY, "decode": DECODE_BODY}

# ---- preludes -----------------------------------------------------------------------------------------
# CUDA (NVRTC): the _rn intrinsics are single correctly rounded ops that are never contracted into FMA;
# NVRTC defaults give IEEE division/sqrt and no flush to zero, and the intrinsics pin that down explicitly.
CUDA_HEADER = ""
CUDA_PRELUDE = """
#define TID threadIdx.x
#define TOKEN blockIdx.x
#define HEAD blockIdx.y
#define BATCH blockIdx.z
#define NTOK gridDim.x
#define NHEAD gridDim.y
#define SHARED(type, name, n) __shared__ type name[n]
#define BARRIER() __syncthreads()
#define ADD(a, b) __fadd_rn((a), (b))
#define SUB(a, b) __fsub_rn((a), (b))
#define MUL(a, b) __fmul_rn((a), (b))
#define DIV(a, b) __fdiv_rn((a), (b))
#define SQRT(a) __fsqrt_rn((a))
#define NEG(a) (-(a))
#define ABS(a) fabsf((a))
#define TO_F32(v) static_cast<float>(v)
"""

# Metal: contraction is switched off for the whole translation unit, division and sqrt are the precise::
# variants (correctly rounded), and every op is a named inline function. Not run here (no Apple GPU).
METAL_HEADER = """
#pragma clang fp contract(off)
inline float vq_add(float a, float b) { return a + b; }
inline float vq_sub(float a, float b) { return a - b; }
inline float vq_mul(float a, float b) { return a * b; }
inline float vq_div(float a, float b) { return metal::precise::divide(a, b); }
inline float vq_sqrt(float a) { return metal::precise::sqrt(a); }
"""
METAL_PRELUDE = """
#define TID thread_position_in_threadgroup.x
#define TOKEN threadgroup_position_in_grid.x
#define HEAD threadgroup_position_in_grid.y
#define BATCH threadgroup_position_in_grid.z
#define NTOK threadgroups_per_grid.x
#define NHEAD threadgroups_per_grid.y
#define SHARED(type, name, n) threadgroup type name[n]
#define BARRIER() threadgroup_barrier(metal::mem_flags::mem_threadgroup)
#define ADD(a, b) vq_add((a), (b))
#define SUB(a, b) vq_sub((a), (b))
#define MUL(a, b) vq_mul((a), (b))
#define DIV(a, b) vq_div((a), (b))
#define SQRT(a) vq_sqrt((a))
#define NEG(a) (-(a))
#define ABS(a) metal::abs((a))
#define TO_F32(v) static_cast<float>(v)
"""

PRELUDES = {"cuda": (CUDA_HEADER, CUDA_PRELUDE), "metal": (METAL_HEADER, METAL_PRELUDE)}


def assemble(kind: str, backend: str) -> tuple[str, str]:
    """(header, source) of kernel `kind` ("encode" | "decode") for `backend` ("cuda" | "metal")."""
    header, prelude = PRELUDES[backend]
    return header, prelude + BODIES[kind]
