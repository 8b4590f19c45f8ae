"""The host's part of a batched decode step, measured without a GPU: how long Python and MLX take to build one
layer's step (update_and_fetch + the hooked attention) when every GPU kernel is a stand-in that returns ready
zeros. Separates host work from GPU work (docs/decode-step-analysis.md, twelfth pass): a batch cache that launches
per sequence (BatchVeloxKVCache) builds B steps per layer, the B-row cache (SharedBatchVeloxKVCache) one.

    python -m veloxquant.tools.dev.host_build [--batch-sizes 1 4 8] [--context 512] [--layers 8] [--json out.json]

Run it as its own process: it replaces the kernel backend of this process with the stand-ins (a "CUDA" backend
whose kernels compute nothing), so its numbers are host time only, not a speed of the caches.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _stand_ins() -> None:
    import mlx.core as mx

    from ...accelerated import kernels as kpkg
    from ...accelerated.kernels import attention as katt
    from ...accelerated.kernels import backend

    ready: dict = {}

    class StandIn:
        """A compiled kernel's call signature; returns zeros of the output shapes, made once per shape."""

        def __init__(self, *a, **kw):
            self.name = kw.get("name", "")      # the kernel it stands for (tools/dev/host_split.py tells launches apart)

        def specialized(self, template=None):
            return self

        def __call__(self, inputs, output_shapes, output_dtypes, **kw):
            key = tuple((tuple(s), d) for s, d in zip(output_shapes, output_dtypes))
            if key not in ready:
                ready[key] = [mx.zeros(s, dtype=d) for s, d in key]
                mx.eval(ready[key])
            return ready[key]

    backend._gpu_backend.cache_clear()
    backend._gpu_backend = lambda: ("cuda", "stand-in kernels")
    backend.available = kpkg.available = lambda: (True, "stand-in kernels")
    backend.cuda_kernel = StandIn
    backend.kernel = lambda *a: StandIn()
    katt._mma_available = lambda: True
    katt._sm_count = lambda: 132


def measure(batch_sizes, context: int, layers: int, steps: int, heads=(32, 8), d: int = 128, log=print) -> list:
    """[{batch, cache, host_build_layer_s, rounds}] for each batch size, both batch caches, alternating twice."""
    import mlx.core as mx
    from mlx_lm.models import base

    from ...accelerated import cache as vc
    from ...accelerated import tuning
    hq, hkv = heads
    rows = []
    for b in batch_sizes:
        seen: dict = {}
        for shared in (True, False, True, False):
            with tuning.override(shared=shared):     # which batch cache merge makes
                caches = []
                for layer in range(layers):
                    singles = []
                    for i in range(b):
                        c = vc.TurboQuantKVCache(bits=4, window=0, layer=layer, seed=1)
                        t = max(1, context - 17 * i)
                        c.update_and_fetch(mx.zeros((1, hkv, t, d), mx.float16), mx.zeros((1, hkv, t, d), mx.float16))
                        singles.append(c)
                    caches.append(singles[0].merge(singles))
                q = mx.zeros((b, hq, 1, d), mx.float16)
                kv = mx.zeros((b, hkv, 1, d), mx.float16)
                ts = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    mask = caches[0].make_mask(1)
                    outs = []
                    for c in caches:
                        k, v = c.update_and_fetch(kv, kv)
                        outs.append(base.scaled_dot_product_attention(q, k, v, cache=c, scale=d ** -0.5, mask=mask))
                    ts.append(time.perf_counter() - t0)
                    mx.eval(outs)
            name = type(caches[0]).__name__
            seen.setdefault(name, []).append(statistics.median(ts[steps // 4:]) / layers)
            log(f"B={b} {name:<26} host build {seen[name][-1] * 1e6:7.1f} us per layer")
        for name, vals in seen.items():
            rows.append({"batch": b, "cache": name, "host_build_layer_s": statistics.median(vals), "rounds": vals})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="host_build", description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import mlx.core as mx
    mx.set_default_device(mx.cpu)
    _stand_ins()
    from .._env import run_record
    rows = measure(args.batch_sizes, args.context, args.layers, args.steps)
    res = {**run_record("python -m veloxquant.tools.dev.host_build"),
           "what": "host build of one layer's decode step with "
           "stand-in kernels (turboquant b4, 32 query / 8 KV heads, d = 128, float16): Python and MLX graph calls only",
           "context": args.context, "layers": args.layers, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
