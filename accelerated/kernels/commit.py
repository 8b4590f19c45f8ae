"""One launch that stores an append's encoded rows in the caches' buffers, in place, and evaluates its
deferred checks (spec/streaming.md 'Deferred rejection'): the decode step's commit for both streams of a
layer, instead of one slice update per record field plus a separate check launch.

`commit(writes, checks, after)`: `writes` are (dst, src) pairs of equal shape, dst a view of a buffer the
caller owns (the rows being appended, or the old rows when a buffer grows); `checks` are the
(kind, array, message) records of accelerated.ops.numerics.deferred_checks; `after` the token of the
previous commit to the same buffers (or None). Returns the token: a (n_checks or 1, NB) uint32 array,
nonzero where check i failed in block column j.

Why in place is sound here: MLX sees the buffers only as inputs, so it orders nothing after this kernel by
itself (its CUDA graphs order nodes by the buffers they write). Every reader of the rows therefore takes
the token as an input (the attention kernels do) or waits for it (`mx.eval(token)`: accelerated.stream
does before any MLX op reads the buffers), and each commit takes the previous one's token, so commits to
one buffer run in order. The rows written are past every view handed out before, so no reader of an
earlier step is affected.
"""
from __future__ import annotations

import functools

import mlx.core as mx

from veloxquant.accelerated.kernels import backend

NT = 256
MAX_BLOCKS = 64          # block columns per write / check (large prefill chunks)
_TESTS = {"nonfinite": "!isfinite(v)", "flag": "v != 0.0f"}

PRELUDES = {
    "cuda": """
#define TID threadIdx.x
#define GROUP_X blockIdx.x
#define GROUP_Y blockIdx.y
#define NGROUPS_X gridDim.x
#define SHARED(type, name, n) __shared__ type name[n]
#define BARRIER() __syncthreads()
#define MUT(type, p) const_cast<type*>(p)
""",
    "metal": """
#define TID thread_position_in_threadgroup.x
#define GROUP_X threadgroup_position_in_grid.x
#define GROUP_Y threadgroup_position_in_grid.y
#define NGROUPS_X threadgroups_per_grid.x
#define SHARED(type, name, n) threadgroup type name[n]
#define BARRIER() threadgroup_barrier(metal::mem_flags::mem_threadgroup)
#define MUT(type, p) const_cast<device type*>(p)
using metal::isfinite;
""",
}


def _offset(name: str, ndim: int, var: str) -> str:
    """C statements: `var` = the offset of flat element e of array `name` through its shape/strides."""
    lines = [f"      int64_t {var} = 0;\n", "      {\n", "        int64_t rest = e;\n"]
    for k in reversed(range(ndim)):
        lines.append(f"        {var} += (rest % {name}_shape[{k}]) * {name}_strides[{k}];\n")
        lines.append(f"        rest /= {name}_shape[{k}];\n")
    lines.append("      }\n")
    return "".join(lines)


def body(writes: tuple, checks: tuple) -> str:
    """Kernel text. writes: ((ctype, ndim), ...) of the destination/source pairs w{i}d, w{i}s; checks:
    ((kind, ndim), ...) of c{i}. Threadgroup row y < len(writes) copies write y, the next rows evaluate the
    checks; block columns stride over the elements."""
    parts = [f"""
  const int tid = (int)TID;
  const int which = (int)GROUP_Y;
  const int col = (int)GROUP_X;
  const int ncol = (int)NGROUPS_X;
  SHARED(uint32_t, hit, {NT});
  uint32_t mine = 0u;
"""]
    for i, (ctype, ndim) in enumerate(writes):
        size = " * ".join(f"(int64_t)w{i}s_shape[{k}]" for k in range(ndim))
        parts.append(f"""
  if (which == {i}) {{
    const int64_t n = {size};
    for (int64_t e = (int64_t)col * {NT} + tid; e < n; e += (int64_t)ncol * {NT}) {{
{_offset(f"w{i}s", ndim, "src")}{_offset(f"w{i}d", ndim, "dst")}      MUT({ctype}, w{i}d)[dst] = w{i}s[src];
    }}
  }}
""")
    for i, (kind, ndim) in enumerate(checks):
        size = " * ".join(f"(int64_t)c{i}_shape[{k}]" for k in range(ndim))
        parts.append(f"""
  if (which == {len(writes) + i}) {{
    const int64_t n = {size};
    for (int64_t e = (int64_t)col * {NT} + tid; e < n; e += (int64_t)ncol * {NT}) {{
{_offset(f"c{i}", ndim, "off")}      const float v = static_cast<float>(c{i}[off]);
      if ({_TESTS[kind]}) {{
        mine = 1u;
      }}
    }}
  }}
""")
    parts.append(f"""
  hit[tid] = mine;
  BARRIER();
  if (tid == 0) {{
    if (which >= {len(writes)}) {{
      uint32_t any = 0u;
      for (int k = 0; k < {NT}; ++k) {{
        any |= hit[k];
      }}
      out[(which - {len(writes)}) * ncol + col] = any;
    }} else if ({len(checks)} == 0 && which == 0) {{
      out[col] = 0u;
    }}
  }}
""")
    return "".join(parts)


_CTYPES = {mx.uint32: "uint32_t", mx.float32: "float", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16",
           mx.uint8: "uint8_t", mx.int32: "int32_t", mx.bool_: "bool"}
_MTYPES = {mx.uint32: "uint32_t", mx.float32: "float", mx.float16: "half", mx.bfloat16: "bfloat",
           mx.uint8: "uint8_t", mx.int32: "int32_t", mx.bool_: "bool"}


@functools.lru_cache(maxsize=256)
def _kernel(writes: tuple, checks: tuple, has_after: bool):
    be = backend.backend()
    types = _CTYPES if be == "cuda" else _MTYPES
    wsig = tuple((types[dt], nd) for dt, nd in writes)
    names = (["after"] if has_after else []) + [n for i in range(len(writes)) for n in (f"w{i}d", f"w{i}s")] + \
        [f"c{i}" for i in range(len(checks))]
    source = PRELUDES[be] + body(wsig, checks)
    # `after` only orders this launch after the previous commit; mention it so it is a real input
    source = source.replace("  uint32_t mine = 0u;\n", "  uint32_t mine = 0u;\n  (void)after;\n", 1) if has_after \
        else source
    tag = f"{len(writes)}w{len(checks)}c"
    if be == "cuda":
        return backend.cuda_kernel(name=f"vq_commit_{tag}", input_names=names, output_names=["out"],
                                   source=source, ensure_row_contiguous=False)
    return mx.fast.metal_kernel(name=f"vq_commit_{tag}", input_names=names, output_names=["out"],
                                source=source, ensure_row_contiguous=False)


def commit(writes: list, checks: list, after: mx.array | None = None, columns: int | None = None) -> mx.array:
    """Store the writes in place and evaluate the checks in one launch; returns the token (see module).
    `columns` fixes the number of block columns (default: enough for the largest write or check)."""
    if not backend.available()[0]:
        raise RuntimeError(backend.available()[1])
    for dst, src in writes:
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise ValueError(f"writes: destination {dst.dtype} {dst.shape} != source {src.dtype} {src.shape}")
    # scalar flags (the encode kernel's fault slots) are read as one-element arrays (a view, no copy)
    checks = [(kind, a.reshape(1) if a.ndim == 0 else a, msg) for kind, a, msg in checks]
    sizes = [s.size for _, s in writes] + [a.size for _, a, _ in checks]
    ncol = columns or max(1, min(MAX_BLOCKS, -(-max(sizes + [1]) // NT)))
    wsig = tuple((s.dtype, s.ndim) for _, s in writes)
    csig = tuple((kind, a.ndim) for kind, a, _ in checks)
    inputs = ([after] if after is not None else []) + [x for d, s in writes for x in (d, s)] + \
        [a for _, a, _ in checks]
    (out,) = _kernel(wsig, csig, after is not None)(
        inputs=inputs, grid=(NT * ncol, len(writes) + len(checks), 1), threadgroup=(NT, 1, 1),
        output_shapes=[(max(1, len(checks)), ncol)], output_dtypes=[mx.uint32])
    return out
