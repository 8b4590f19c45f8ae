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

from . import backend, kernel_cache, loader
from . import methods as km

NT = 256
MAX_BLOCKS = 64          # block columns per write / check (large prefill chunks)
_TESTS = ("nonfinite", "flag")     # the checks' kinds (csrc/commit_check.h)
MAX_NDIM = 6             # dimensions of a write or check array (csrc/commit_offset.h)

PRELUDES = {be: loader.backend_file(f"commit_{be}", be) for be in ("cuda", "metal")}


def body(writes: tuple, checks: tuple, after: bool = False) -> str:
    """Kernel text after a prelude (csrc/commit.h, one commit_write.h per write, one commit_check.h per check,
    commit_end.h). writes: ((ctype, ndim), ...) of the destination/source pairs w{i}d, w{i}s; checks: ((kind, ndim),
    ...) of c{i}; `after`: the launch takes the previous commit's token. Threadgroup row y < len(writes) copies write
    y, the next rows evaluate the checks; block columns stride over the elements."""
    for what, sig in (("writes", writes), ("checks", checks)):
        for _, ndim in sig:
            if not 1 <= ndim <= MAX_NDIM:
                raise ValueError(f"{what}: {ndim} dimensions, the kernel takes 1 to {MAX_NDIM}")
    parts = [loader.defines({"VQ_NT": NT, "VQ_AFTER": int(after), "VQ_NWRITES": len(writes),
                             "VQ_NCHECKS": len(checks)}), loader.text("commit.h")]
    for i, (ctype, ndim) in enumerate(writes):
        names = {"SRC": f"w{i}s", "DST": f"w{i}d"}
        arrays = {f"{k}{x.upper()}": f"{n}{x}" for k, n in names.items() for x in ("", "_shape", "_strides")}
        parts += [loader.defines({"VQ_W_ROW": i, "VQ_W_TYPE": ctype, "VQ_W_NDIM": ndim,
                                  **{f"VQ_W_{k}": v for k, v in arrays.items()}}), loader.text("commit_write.h")]
    for i, (kind, ndim) in enumerate(checks):
        if kind not in _TESTS:
            raise ValueError(f"checks: kind {kind!r} is not one of {_TESTS}")
        parts += [loader.defines({"VQ_C_ROW": len(writes) + i, "VQ_C_NDIM": ndim, "VQ_C_ARR": f"c{i}",
                                  "VQ_C_ARR_SHAPE": f"c{i}_shape", "VQ_C_ARR_STRIDES": f"c{i}_strides",
                                  "VQ_C_FLAG": int(kind == "flag")}), loader.text("commit_check.h")]
    return "".join(parts) + loader.text("commit_end.h")


def assemble(be: str, writes: tuple, checks: tuple, after: bool) -> str:
    """The kernel's source for backend `be` (prelude and body, `body`'s arguments)."""
    return PRELUDES[be] + body(writes, checks, after)


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
    source = assemble(be, wsig, checks, has_after)
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
    after = km.order(after) if after is not None else None     # one variant after either kind of token
    inputs = ([after] if after is not None else []) + [x for d, s in writes for x in (d, s)] + \
        [a for _, a, _ in checks]
    call = dict(grid=(NT * ncol, len(writes) + len(checks), 1), threadgroup=(NT, 1, 1),
                output_shapes=[(max(1, len(checks)), ncol)], output_dtypes=[mx.uint32])
    if after is None and kernel_cache.CACHE.recorder is not None and backend.backend() == "cuda":
        # the warm-up: a write list met only as a fresh cache's first store (no previous token) may follow a token
        # in a later turn (a mixed layer's chunk where both roles encode): record that variant too
        _kernel(wsig, csig, True)(inputs=[mx.zeros((1, 1), dtype=mx.bool_)] + inputs, **call)
    (out,) = _kernel(wsig, csig, after is not None)(inputs=inputs, **call)
    return out
