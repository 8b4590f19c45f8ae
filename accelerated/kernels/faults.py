"""The deferred checks of one append evaluated in one launch (spec/streaming.md, 'Deferred rejection').

`flags(pending)` turns the (kind, array, message) records of accelerated.ops.numerics.deferred_checks into
one lazy (n,) uint32 array, nonzero where a check fails. On a GPU one generated kernel reads every checked
array through its strides (one threadgroup per check); elsewhere MLX ops compute the same flags
(numerics.fault_flags). A decode step's checks are then a single small launch with no host sync.
"""
from __future__ import annotations

import functools

import mlx.core as mx

from accelerated.kernels import backend
from accelerated.ops import numerics

NT = 256
_TESTS = {"nonfinite": "!isfinite(v)", "flag": "v != 0.0f"}

PRELUDES = {
    "cuda": """
#define TID threadIdx.x
#define GROUP_Y blockIdx.y
#define SHARED(type, name, n) __shared__ type name[n]
#define BARRIER() __syncthreads()
""",
    "metal": """
#define TID thread_position_in_threadgroup.x
#define GROUP_Y threadgroup_position_in_grid.y
#define SHARED(type, name, n) threadgroup type name[n]
#define BARRIER() threadgroup_barrier(metal::mem_flags::mem_threadgroup)
using metal::isfinite;
""",
}


def body(signature: tuple[tuple[str, int], ...]) -> str:
    """Kernel text for checks [(kind, ndim)]: threadgroup y = check i, its threads stride over the
    elements (unravelled through a{i}_shape / a{i}_strides), then OR their hits."""
    parts = [f"""
  const int tid = (int)TID;
  const int which = (int)GROUP_Y;
  SHARED(uint32_t, hit, {NT});
  uint32_t mine = 0u;
"""]
    for i, (kind, ndim) in enumerate(signature):
        size = " * ".join(f"(int64_t)a{i}_shape[{k}]" for k in range(ndim))
        unravel = []
        for k in reversed(range(ndim)):
            unravel.append(f"      off += (rest % a{i}_shape[{k}]) * a{i}_strides[{k}];\n"
                           f"      rest /= a{i}_shape[{k}];\n")
        parts.append(f"""
  if (which == {i}) {{
    const int64_t n = {size};
    for (int64_t e = tid; e < n; e += {NT}) {{
      int64_t rest = e;
      int64_t off = 0;
{''.join(unravel)}      const float v = static_cast<float>(a{i}[off]);
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
    uint32_t any = 0u;
    for (int k = 0; k < {NT}; ++k) {{
      any |= hit[k];
    }}
    out[which] = any;
  }}
""")
    return "".join(parts)


@functools.lru_cache(maxsize=256)
def _kernel(signature: tuple[tuple[str, int], ...]):
    be = backend.backend()
    names = [f"a{i}" for i in range(len(signature))]
    source = PRELUDES[be] + body(signature)
    tag = "_".join(f"{k[0]}{n}" for k, n in signature)
    if be == "cuda":
        return mx.fast.cuda_kernel(name=f"vq_faults_{tag}", input_names=names, output_names=["out"],
                                   source=source, ensure_row_contiguous=False)
    return mx.fast.metal_kernel(name=f"vq_faults_{tag}", input_names=names, output_names=["out"],
                                source=source, ensure_row_contiguous=False)


def flags(pending: list) -> mx.array:
    """(n,) lazy flags of recorded checks [(kind, array, message)], nonzero where a check fails."""
    if not pending:
        raise ValueError("pending: no checks to evaluate")
    pending = [(kind, a.reshape(1) if a.ndim == 0 else a, msg) for kind, a, msg in pending]  # scalar flags
    arrays = [a for _, a, _ in pending]
    if not backend.available()[0] or any(a.size == 0 for a in arrays):
        return numerics.fault_flags(pending)
    signature = tuple((kind, a.ndim) for kind, a, _ in pending)
    (out,) = _kernel(signature)(inputs=arrays, grid=(NT, len(arrays), 1), threadgroup=(NT, 1, 1),
                                output_shapes=[(len(arrays),)], output_dtypes=[mx.uint32])
    return out
