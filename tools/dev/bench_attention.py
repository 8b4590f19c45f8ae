"""The decode attention call alone under launch variants (a benchmark, not a test; needs the GPU kernels).

Variants set module constants of accelerated.kernels.attention (TENSOR_CORES, TC_PREFETCH, TC_MIN_BLOCKS,
TC_WAVES, TOKENS_PER_SPLIT, LONG_SPLIT, PREFETCH, NT, COLD_LOOPS, FUSE_COMBINE) for one arm's caches at each context; 8-layer chains of
`attention(...)` (each layer's output is the next layer's query), the variants interleaved in every
repetition over a pool of 10 queries, medians per layer. Kernel objects are made once per variant. Each
variant's output on one layer is compared with the first variant's (max |difference|). The tables of
docs/decode-step-analysis.md "Fifth pass" came from the device-only scripts this replaces.

    python3 -m veloxquant.tools.dev.bench_attention --contexts 4096 32768 131072 --preset tc-shape \\
        --json docs/bench/h200-attention-sweep.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from veloxquant.tools._env import utc_now_iso, versions

KNOBS = ("TENSOR_CORES", "TC_PREFETCH", "TC_MIN_BLOCKS", "TC_WAVES", "TOKENS_PER_SPLIT", "LONG_SPLIT", "PREFETCH",
         "NT", "COLD_LOOPS", "FUSE_COMBINE")
PRESETS = {
    "tc-shape": [["scalar", {"TENSOR_CORES": False}], ["tensor cores", {}],
                 ["tc, next chunk in flight", {"TC_PREFETCH": 1}], ["tc, 3 chunks in flight", {"TC_PREFETCH": 3}],
                 ["tc, 3 threadgroups / SM", {"TC_MIN_BLOCKS": 3}], ["tc, two waves", {"TC_WAVES": 2}]],
    "cold-loops": [["tensor cores", {}], ["tc, cold loops rolled up", {"COLD_LOOPS": True}],
                   ["scalar", {"TENSOR_CORES": False}], ["scalar, cold loops rolled up", {"TENSOR_CORES": False,
                                                                                           "COLD_LOOPS": True}]],
    "combine": [["tensor cores", {}], ["tc, combine as its own launch", {"FUSE_COMBINE": False}],
                ["scalar", {"TENSOR_CORES": False}],
                ["scalar, combine as its own launch", {"TENSOR_CORES": False, "FUSE_COMBINE": False}]],
    "scalar-split": [["scalar", {"TENSOR_CORES": False}],
                     ["scalar, 512-token splits", {"TENSOR_CORES": False, "LONG_SPLIT": 512}],
                     ["scalar, 2048-token splits", {"TENSOR_CORES": False, "LONG_SPLIT": 2048}]],
}


def parse_variants(preset: str | None, text: str | None) -> list[tuple[str, dict]]:
    """[(name, {constant: value})] from a preset name or a JSON list of [name, {...}]; unknown constants are
    an error (a typo would otherwise time the default twice)."""
    raw = PRESETS[preset] if preset else json.loads(text or "[]")
    out = []
    for item in raw:
        name, knobs = item
        bad = sorted(set(knobs) - set(KNOBS))
        if bad:
            raise ValueError(f"variant {name!r}: unknown constants {bad} (known: {', '.join(KNOBS)})")
        out.append((str(name), dict(knobs)))
    if not out:
        raise ValueError("no variants: give --preset or --variants")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", nargs="+", type=int, default=[4096, 32768, 131072])
    p.add_argument("--arm", default="turboquant b4", help="an arm of tools/bench/decode.py")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--reps", type=int, default=14)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None)
    p.add_argument("--variants", default=None, help='JSON: [["name", {"TC_PREFETCH": 1}], ...]')
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    variants = parse_variants(args.preset, args.variants)
    import mlx.core as mx

    from veloxquant.accelerated.kernels import attention as katt
    from veloxquant.accelerated.kernels import backend
    from veloxquant.tools.bench.harness import device_info
    from veloxquant.tools.bench.decode import B, D, HKV, HQ, _make, _prefill
    if backend.backend() is None:
        print(f"bench_attention: {backend.available()[1]}", file=sys.stderr)
        return 2
    defaults = {k: getattr(katt, k) for k in KNOBS}
    original = katt._kernel
    made = original.__wrapped__
    objects: dict = {}
    current = {"name": ""}

    def kernel(*key):        # one kernel object per variant (launch bounds and templates differ)
        k = (current["name"],) + key
        if k not in objects:
            objects[k] = made(*key)
        return objects[k]

    def apply(name, knobs):
        current["name"] = name
        for k in KNOBS:
            setattr(katt, k, knobs.get(k, defaults[k]))
        katt._static.cache_clear()

    katt._kernel = kernel
    rows = []
    try:
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
                apply(name, knobs)
                y = chain(qs[0], kv[:1]).astype(mx.float32)
                mx.eval(y)
                ref = y if ref is None else ref
                diffs[name] = float(mx.abs(y - ref).max())
            times = {name: [] for name, _ in variants}
            for rep in range(args.reps):
                for name, knobs in variants:
                    apply(name, knobs)
                    mx.synchronize()
                    t0 = time.perf_counter()
                    mx.eval(chain(qs[rep % len(qs)], kv))
                    mx.synchronize()
                    if rep >= 2:
                        times[name].append((time.perf_counter() - t0) / args.layers)
            for name, knobs in variants:
                row = {"context": t, "variant": name, "set": knobs, "layer_s": statistics.median(times[name]),
                       "max_abs_diff_vs_first": diffs[name]}
                rows.append(row)
                print(f"{t:7d}  {name:34s} {row['layer_s'] * 1e6:8.1f} us/layer   diff {diffs[name]:.3g}", flush=True)
            del caches, kv
            mx.clear_cache()
    finally:
        katt._kernel = original
        apply("", {})
    if args.json:
        out = {"command": " ".join(["python3 -m veloxquant.tools.dev.bench_attention"] + (argv or sys.argv[1:])),
               "date": utc_now_iso(), "device": device_info(), "versions": versions(), "arm": args.arm,
               "layers": args.layers, "reps": args.reps, "rows": rows,
               "note": "attention call alone (partial + fused combine), host build and launch included, "
                       "8-layer chains; compare variants within one run only"}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
