"""The encode and decode kernels' texts: one body per kernel, shared by CUDA and Metal (csrc/encode.h, decode.h and
the fragments they include), plus a thin prelude per backend (csrc/<backend>_prelude, _encode_ops, _header),
composed by accelerated/kernels/loader.py (spec/number-model.md, rotation.md, codebooks.md, packing.md,
methods/*.md, streaming.md).

Shape of the bodies: one SIMD group (a CUDA warp, a Metal simdgroup: 32 lanes) per row, where a row is one
token (a KIVI key row: one group of G tokens); several warps per threadgroup; each warp takes a contiguous
chunk of rows (its head's sign bits stay cached in two registers).
Head dim d = RM * NB (rotation.md: m = RM in 1, 12, 20, 28, block length n = NB a power of two). Lane l
holds coordinates j = l + LW*e, e = 0..E-1 (LW = min(NB, 32), E = d / LW), in registers, so block k of the
spec is slots k*EN .. k*EN + EN - 1 of every lane (EN = NB / LW) and position i of a block sits in the same
lane and slot offset in every block. For a power of two d (RM = 1) this is LW = min(d, 32), E = d / LW. So:
- the fold (number-model.md) first adds the blocks left to right inside each lane (block fold, RM > 1),
  then does the halving strides >= LW inside each lane (slot e += slot e + s) and the last strides
  LW/2..1 with shuffle-down, exactly the spec's tree;
- stage A of H (rotation.md, ascending stages on each block) does h = 1..LW/2 across lanes (xor shuffles:
  the lane with bit h clear computes lo + hi, its partner lo - hi) and h >= LW inside each lane; stage B
  (RM > 1) is all inside each lane: output block j = +-block 0 +- ... +- block RM-1 from +0, left to
  right, the signs from row j of H_m (encode) or H_m^T (decode) of spec/formats.toml, compiled in;
- with RM > 1 and NB < 32 only NB of the 32 lanes hold coordinates (d = 80: 4 lanes, 20 slots each);
- quantize counts strict crossings by binary search over the sorted boundaries (the count of B_k < u, the
  same number as the spec's linear count for any u; methods.py checks the tables are sorted);
- packing: 1-bit codes by ballot, 2/4/8-bit codes by an OR over aligned lane groups, 3/5/6/7-bit codes
  staged through per-warp threadgroup memory (codes never straddle words, packing.md); where a slot's LW
  codes are not whole words (RM > 1 with NB < 32: d = 80 has 4 lanes) the other widths are staged too.
No threadgroup barrier runs per row; the only one is at the end of encode, where each threadgroup ORs its
warps' fault flags into one slot of the `fault` output (no atomics, no host sync: methods.py hands the
flags to accelerated.ops.numerics.fault).

Macros each prelude defines (the bodies use nothing else that is backend-specific):
- position: LANE, WARP (simdgroup in the threadgroup), NWARPS, GROUP (threadgroup in the grid, x),
  NGROUPS; the older TID, TOKEN, HEAD, BATCH, NTOK, NHEAD stay defined for other kernels;
- memory and sync: SHARED(type, name, n), BARRIER() (threadgroup), WARP_SYNC() (simdgroup);
- cross-lane: SHFL_XOR(v, m), SHFL_DOWN(v, s), SHFL(v, lane), ANY(p), BALLOT(p) (32-bit lane mask);
- exact float arithmetic: ADD SUB MUL DIV SQRT (one binary32 op, RNE, never contracted), NEG ABS (sign
  bit), FLIP(v, m) (XOR of the sign bit with m = 0 or 0x80000000: v or -v exactly), MINF MAXF (exact),
  TO_F32 (exact upcast), TO_TS (RNE to the stored side-information type TS),
  PIN(v) (an inexact product that feeds an add or subtract in the same lane: a no-op on CUDA, whose _rn
  intrinsics are never fused; an opaque integer round trip on Metal, so no compiler can contract it).
Float variables and float arrays are named `f_*` so a lint can check that every float operation goes
through a helper (tests/test_kernels_source.py); literals end in `f`.

Template constants (set per launch by methods.py): M (method id), D (head dim), TS (dtype of f_s1/f_s2).
"""
from __future__ import annotations

from .. import layouts
from . import loader

METHOD_IDS = layouts.KERNEL_IDS      # the kernels' template argument M (one table: accelerated/layouts.py)

ENCODE_INPUTS = ["x", "sig", "tau", "f_c1", "f_b1", "f_c2", "f_b2", "f_k", "meta"]
ENCODE_OUTPUTS = ["codes1", "codes2", "f_s1", "f_s2", "fault"]
DECODE_INPUTS = ["codes1", "codes2", "f_s1", "f_s2", "sig", "tau", "f_c1", "f_c2", "f_k", "meta"]
DECODE_OUTPUTS = ["f_out"]

# f_k = [s_d, A_d, 2^23, 0x1.8p23 (rint magic), EPS (mlx_affine), L = 2^bits - 1, FLT_MAX, 0]
# meta = [0 (PIN's opaque zero), bits, bits2, G, role is keys (0/1), Q (tokens to encode), first token
#         to check for NaN/Inf, 0]
K_SD, K_AD, K_TWO23, K_MAGIC, K_EPS, K_LEVELS, K_FMAX = range(7)
N_CONSTS = 8
N_META = 8
SMEM_CODES = 8192        # bytes of per-warp code staging in a threadgroup: warps * 2 * D <= this
# Warps of one threadgroup at most (accelerated.tuning's max_warps, 8): a CUDA block gets at most 64K registers
# and ptxas gives these kernels up to 255 per thread (decode at d = 80: 200; at d = 1024: 255), so 8 warps
# (256 threads, 255 x 256 <= 65536) always launch; 32 warps did not at d = 80 / 96 ("too many resources requested
# for launch", and where MLX did not report it the output was never written). Metal lowers a pipeline's thread
# limit with its register use too.
REGISTER_FILE = 65536    # 32-bit registers per CUDA block (sm_90)
MAX_REGISTERS = 255      # per thread, the most ptxas assigns


# the encode body's check-only tokens (csrc/encode.h): x's own (a window with a scope's chunk: kernels/append.py WINDOWED)
CHECKS = {"VQ_CHECK_COUNT": "check_count.h", "VQ_CHECK_ROW": "check_row.h"}


def body(kind: str) -> str:
    """The body of kernel `kind` ("encode" | "decode"): csrc/<kind>.h after the Hadamard rows it compiles in."""
    files = {"encode": "encode.h", "decode": "decode.h"}
    if kind not in files:
        raise ValueError(f"kind: {kind!r} is not 'encode' or 'decode'")
    return loader.hadamard() + loader.text(files[kind], {"VQ_ENCODE_ARRAYS": "encode_arrays.h", **CHECKS})


BODIES = {kind: body(kind) for kind in ("encode", "decode")}
ENCODE_BODY, DECODE_BODY = BODIES["encode"], BODIES["decode"]
# (header, prelude) per backend: csrc/<backend>_header and <backend>_prelude (which includes <backend>_encode_ops)
PRELUDES = {be: (loader.backend_file(f"{be}_header", be), loader.backend_file(f"{be}_prelude", be))
            for be in ("cuda", "metal")}
(CUDA_HEADER, CUDA_PRELUDE), (METAL_HEADER, METAL_PRELUDE) = PRELUDES["cuda"], PRELUDES["metal"]


def assemble(kind: str, backend: str) -> tuple[str, str]:
    """(header, source) of kernel `kind` ("encode" | "decode") for `backend` ("cuda" | "metal")."""
    if backend not in PRELUDES:
        raise ValueError(f"backend: {backend!r} is not one of {sorted(PRELUDES)}")
    header, prelude = PRELUDES[backend]
    return header, prelude + BODIES[kind]
