"""A clock on the GPU for benchmarks (CUDA), and a gate that makes GPU work wait for other GPU work.

A decode step timed on the host is max(host work, GPU work) at best, and which of the two it is decides what to
make faster. So: `hold(ns)` is a one-thread kernel that spins for `ns` nanoseconds of the GPU's %globaltimer and
returns the time it stopped; `gate(arrays, t)` copies the measured graph's inputs in a kernel that also reads the
hold's output, so none of the graph's launches starts earlier, and the host encodes and submits all of them while
the GPU spins. `stamp(x)` is a one-thread kernel that reads x and returns the time it ran. The GPU time of the
graph is stamp - hold, less `overhead_s()` (the gate and stamp launches with nothing between them).
%globaltimer counts nanoseconds; its updates can be ~1 µs apart, so measure spans of hundreds of µs.

Why a gate and not mx.depends: MLX's CUDA backend orders kernels by the buffers they read and write (its graph
runs independent kernels side by side), and mx.depends only orders the evaluation: measured on the H200, a stamp
behind mx.depends ran ~2.8 ms before the hold ended. The same holds for a benchmark's layers: a layer's new key
and value must be gated on the previous layer's output, as a model's projections are, or every layer's append
runs at once, ahead of the attention chain.

The clock needs CUDA (`available()` says why not elsewhere: Metal has no such timer that a custom kernel can read
and that we could check); the gate is a custom kernel on CUDA and Metal, and nothing on the CPU (one stream, in
order).
"""
from __future__ import annotations

import functools

import mlx.core as mx

from ...accelerated.kernels import backend

HOLD_NS = 3_000_000     # 3 ms: longer than the host needs to encode and submit 8 layers of any arm's step
                        # (~0.1-1 ms on the H200's host), so the GPU never waits for a launch inside the span

_READ = '  long long t;\n  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));\n'


def available() -> tuple[bool, str]:
    cuda = getattr(mx, "cuda", None)
    if cuda is None or not cuda.is_available():
        return False, "no CUDA in this mlx build: the GPU clock reads CUDA's %globaltimer"
    if mx.default_device().type != mx.DeviceType.gpu:
        return False, "default device is the CPU"
    return True, "CUDA %globaltimer"


@functools.lru_cache(maxsize=None)
def _kernels():
    hold = mx.fast.cuda_kernel(
        name="vq_clock_hold", input_names=["ns"], output_names=["t_end"],
        source=_READ + "  const long long t0 = t;\n"
                       "  while (t - t0 < ns[0]) { asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t)); }\n"
                       "  t_end[0] = t;\n")
    stamp = mx.fast.cuda_kernel(name="vq_clock_stamp", input_names=["x"], output_names=["t_now"],
                                source=_READ + "  t_now[0] = t;\n")
    return hold, stamp


_GATE = {"cuda": "  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;\n  (void)dep;\n",
         "metal": "  const uint i = thread_position_in_grid.x;\n  (void)dep;\n"}


@functools.lru_cache(maxsize=None)
def _gate_kernel(be: str, sizes: tuple):
    n = len(sizes)
    body = _GATE[be] + "".join(f"  if (i < {s}) {{ o{j}[i] = a{j}[i]; }}\n" for j, s in enumerate(sizes))
    make = mx.fast.cuda_kernel if be == "cuda" else mx.fast.metal_kernel
    return make(name=f"vq_gate_{n}_{'_'.join(map(str, sizes))}", input_names=[f"a{j}" for j in range(n)] + ["dep"],
                output_names=[f"o{j}" for j in range(n)], source=body)


def gate(arrays: list, dep: mx.array) -> list:
    """Copies of the arrays made by one kernel that also takes `dep` as an input, so that MLX runs it (and all
    that reads the copies) after the kernel that wrote dep; the arrays themselves where no GPU backend runs
    (accelerated.kernels.backend: the CPU, one stream in order)."""
    be = backend.backend()
    if be is None:
        return list(arrays)
    sizes = tuple(int(a.size) for a in arrays)
    n = max(sizes)
    outs = _gate_kernel(be, sizes)(inputs=[*arrays, dep], output_shapes=[a.shape for a in arrays],
                                        output_dtypes=[a.dtype for a in arrays], grid=(n, 1, 1),
                                        threadgroup=(min(n, 256), 1, 1))
    return list(outs)


def _one(kernel, x: mx.array) -> mx.array:
    (t,) = kernel(inputs=[x], output_shapes=[(1,)], output_dtypes=[mx.int64], grid=(1, 1, 1), threadgroup=(1, 1, 1))
    return t


def hold(ns: int = HOLD_NS) -> mx.array:
    """(1,) int64: the GPU time (ns) at which a spin of `ns` nanoseconds ended."""
    return _one(_kernels()[0], mx.array([int(ns)], dtype=mx.int64))


def stamp(x: mx.array) -> mx.array:
    """(1,) int64: the GPU time (ns) when a kernel reading x ran (after everything x depends on)."""
    return _one(_kernels()[1], x)


def span_s(t_hold: mx.array, t_stamp: mx.array) -> float:
    """Seconds of GPU time between a hold's end and a stamp (both evaluated)."""
    return (int(t_stamp.item()) - int(t_hold.item())) * 1e-9


def overhead_s(arrays: list, reps: int = 11) -> float:
    """The span with nothing between the gate and the stamp: hold, gate(arrays), stamp of the first copy
    (median of reps)."""
    spans = []
    for _ in range(reps):
        th = hold(200_000)
        g = gate(arrays, th)
        te = stamp(g[0])
        mx.eval(th, te, *g)
        spans.append(span_s(th, te))
    return sorted(spans)[reps // 2]
