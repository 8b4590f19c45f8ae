"""The decode attention call alone under launch variants (a benchmark, not a test; needs the GPU kernels).

Variants are accelerated.tuning knobs of the attention launch (KNOBS: tensor_cores, tc_3bit, tc_prefetch,
tc_min_blocks, tc_waves, tokens_per_split, long_split, prefetch, partial_threads, cold_loops, fuse_combine), each run under
tuning.override, for one arm's caches at each context; 8-layer chains of `attention(...)` (each layer's output
is the next layer's query), the variants interleaved in every repetition over a pool of 10 queries, medians per
layer. Each variant's output on one layer is compared with the first variant's (max |difference|).

    python3 -m veloxquant.tools.dev.bench_attention --contexts 4096 32768 131072 --preset tc-shape \\
        --json docs/bench/h200-attention-sweep.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from .._env import run_record

KNOBS = ("tensor_cores", "tc_3bit", "tc_prefetch", "tc_min_blocks", "tc_waves", "tokens_per_split", "long_split", "prefetch",
         "partial_threads", "cold_loops", "fuse_combine")
PRESETS = {
    "tc-shape": [["scalar", {"tensor_cores": False}], ["tensor cores", {}],
                 ["tc, next chunk in flight", {"tc_prefetch": 1}], ["tc, 3 chunks in flight", {"tc_prefetch": 3}],
                 ["tc, 3 threadgroups / SM", {"tc_min_blocks": 3}], ["tc, two waves", {"tc_waves": 2}]],
    "cold-loops": [["tensor cores", {}], ["tc, cold loops rolled up", {"cold_loops": True}],
                   ["scalar", {"tensor_cores": False}], ["scalar, cold loops rolled up", {"tensor_cores": False,
                                                                                           "cold_loops": True}]],
    "combine": [["tensor cores", {}], ["tc, combine as its own launch", {"fuse_combine": False}],
                ["scalar", {"tensor_cores": False}],
                ["scalar, combine as its own launch", {"tensor_cores": False, "fuse_combine": False}]],
    "scalar-split": [["scalar", {"tensor_cores": False}],
                     ["scalar, 512-token splits", {"tensor_cores": False, "long_split": 512}],
                     ["scalar, 2048-token splits", {"tensor_cores": False, "long_split": 2048}]],
}


def parse_variants(preset: str | None, text: str | None) -> list[tuple[str, dict]]:
    """[(name, {knob: value})] from a preset name or a JSON list of [name, {...}] (knob names in either case);
    unknown knobs, knobs outside KNOBS and bad values are an error (a typo would otherwise time the default
    twice)."""
    from ...accelerated import tuning
    raw = PRESETS[preset] if preset else json.loads(text or "[]")
    out = []
    for item in raw:
        name, knobs = item
        bad = sorted(k for k in knobs if str(k).lower() not in KNOBS)
        if bad:
            raise ValueError(f"variant {name!r}: unknown knobs {bad} (known: {', '.join(KNOBS)})")
        try:
            out.append((str(name), tuning.parse(knobs)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"variant {name!r}: {e}") from None
    if not out:
        raise ValueError("no variants: give --preset or --variants")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", nargs="+", type=int, default=[4096, 32768, 131072])
    p.add_argument("--arm", default="turboquant b4", help="an arm of tools/bench/arms.py")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--reps", type=int, default=14)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None)
    p.add_argument("--variants", default=None, help='JSON: [["name", {"tc_prefetch": 1}], ...]')
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    variants = parse_variants(args.preset, args.variants)
    import mlx.core as mx

    from ...accelerated import tuning
    from ...accelerated.kernels import attention as katt
    from ...accelerated.kernels import backend
    from ..bench.arms import make as _make, prefill as _prefill
    from ..bench.harness import B, D, HKV, HQ
    if backend.backend() is None:
        print(f"bench_attention: {backend.available()[1]}", file=sys.stderr)
        return 2
    rows = []
    qs = [mx.random.normal((B, HQ, 1, D), key=mx.random.key(i)).astype(mx.float16) for i in range(10)]
    mx.eval(qs)
    for t in args.contexts:
        caches = _make(args.arm, args.layers)
        _prefill(caches, t, lambda *a: None)
        k1 = mx.random.normal((B, HKV, 1, D)).astype(mx.float16)
        kv = [c.update_and_fetch(k1, k1) for c in caches]
        mx.eval([c.state for c in caches])
        for c in caches:
            c.check()

        def chain(x, layers):
            for kk, vv in layers:
                x = katt.attention(x, kk.record, vv.record, D ** -0.5)
            return x
        ref, diffs = None, {}
        for name, knobs in variants:
            with tuning.override(**knobs):
                y = chain(qs[0], kv[:1]).astype(mx.float32)
                mx.eval(y)
            ref = y if ref is None else ref
            diffs[name] = float(mx.abs(y - ref).max())
        times = {name: [] for name, _ in variants}
        for rep in range(args.reps):
            for name, knobs in variants:
                with tuning.override(**knobs):
                    mx.synchronize()
                    t0 = time.perf_counter()
                    mx.eval(chain(qs[rep % len(qs)], kv))
                    mx.synchronize()
                    dt = time.perf_counter() - t0
                if rep >= 2:
                    times[name].append(dt / args.layers)
        for name, knobs in variants:
            row = {"context": t, "variant": name, "set": knobs, "layer_s": statistics.median(times[name]),
                   "max_abs_diff_vs_first": diffs[name]}
            rows.append(row)
            print(f"{t:7d}  {name:34s} {row['layer_s'] * 1e6:8.1f} us/layer   diff {diffs[name]:.3g}", flush=True)
        del caches, kv
        mx.clear_cache()
    if args.json:
        out = {**run_record("python3 -m veloxquant.tools.dev.bench_attention", argv or None), "arm": args.arm,
               "layers": args.layers, "reps": args.reps, "rows": rows,
               "note": "attention call alone (partial + fused combine), host build and launch included, "
                       "8-layer chains; compare variants within one run only"}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
