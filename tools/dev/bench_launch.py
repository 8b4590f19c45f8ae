"""What one mx.fast.cuda_kernel launch costs against the length of its text (a benchmark, not a test; CUDA only).

MLX copies a custom kernel's whole text into each launch and hashes it at each evaluation
(mlx/backend/cuda/custom_kernel.cpp), which is why accelerated/kernels/backend.py includes our kernels' text
from files. This measures it: a one-line kernel padded with a comment of N characters (in the source, or in the
header), chains of 1 and 16 launches per evaluation, medians; per added launch = (t16 - t1) / 15, split into
building the call (host) and evaluating it. MLX's own `y + 1` chain is the reference.

    python3 -m veloxquant.tools.dev.bench_launch --json docs/bench/h200-launch-cost.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from .._env import run_record

N = 1024
BODY = "unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < %d) out[i] = inp[i] + 1.0f;" % N


def _measure(chain, reps: int = 40) -> dict:
    import mlx.core as mx
    b1, e1, b16, e16 = [], [], [], []
    for _ in range(reps):
        for n, bl, el in ((1, b1, e1), (16, b16, e16)):
            t0 = time.perf_counter()
            y = chain(n)
            t1 = time.perf_counter()
            mx.eval(y)
            t2 = time.perf_counter()
            bl.append(t1 - t0)
            el.append(t2 - t1)

    def med(a):
        return statistics.median(a[5:]) * 1e6
    return {"build1": med(b1), "eval1": med(e1), "build_per_launch": (med(b16) - med(b1)) / 15,
            "eval_per_launch": (med(e16) - med(e1)) / 15}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import mlx.core as mx
    if not (getattr(mx, "cuda", None) and mx.cuda.is_available()):
        print("bench_launch: needs MLX's CUDA backend (mx.fast.cuda_kernel)", file=sys.stderr)
        return 2
    x = mx.zeros((N,))
    mx.eval(x)
    res = {}
    cases = [(f"kernel pad {n}", n, False) for n in (0, 8000, 32000, 64000)] + \
        [(f"kernel header pad {n}", n, True) for n in (0, 64000)]
    for label, pad, in_header in cases:
        padding = ("// " + "x" * pad + "\n") if pad or in_header else ""
        k = mx.fast.cuda_kernel(name=f"vq_launch_{pad}_{int(in_header)}", input_names=["inp"], output_names=["out"],
                                source=BODY if in_header else padding + BODY, header=padding if in_header else "")

        def chain(n, k=k):
            y = x
            for _ in range(n):
                y = k(inputs=[y], grid=(N, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(N,)],
                      output_dtypes=[mx.float32])[0]
            return y
        res[label] = _measure(chain)
        print(label, {k: round(v, 2) for k, v in res[label].items()}, flush=True)

    def add(n):
        y = x
        for _ in range(n):
            y = y + 1
        return y
    res["builtin add"] = _measure(add)
    print("builtin add", {k: round(v, 2) for k, v in res["builtin add"].items()}, flush=True)
    if args.json:
        out = {**run_record("python3 -m veloxquant.tools.dev.bench_launch", argv or None), "us": res}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
