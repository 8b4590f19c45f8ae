"""Where a single sequence's decode step spends the host's time, layer by layer, on the GPU's host: the build of
The decode-step benchmark's 8-layer step timed alone, MLX's encoding of it (`async_eval`) and the wait, then the same with a
launch replaced by a stand-in that returns an earlier call's outputs (no graph node: what that launch costs the
host), and each part timed in place (our update_and_fetch and DecodeStep.step, the SDPA dispatch and
DecodeStep.attend, each custom-kernel call by kernel, the benchmark's gate). docs/decode-step-analysis.md,
thirteenth pass, has a run's numbers and what they say.

    python -m veloxquant.tools.dev.host_split [--contexts 4096 32768] [--arms 'fp16 KVCache' 'turboquant b4'] [--json F]

Steps are synchronous (build, async_eval, wait), so the parts are host time; medians per layer. A timing
probe: the stand-in variants compute nothing and are no speed of the caches. `--stand-ins` runs it without a GPU
(every kernel a stand-in, tools/dev/host_build.py's): the plumbing and the Python alone.
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import statistics
import sys
import time

VARIANTS = {                       # name -> the launches replaced by their saved outputs
    "as is": (),
    "partial saved": ("partial",),
    "combine saved": ("combine",),
    "both saved": ("partial", "combine"),
}


class _Probe:
    """The timers and the launch stand-ins, installed once: `on` times the parts, `saved` names the launches that
    return their first call's outputs."""

    def __init__(self):
        self.times: dict = collections.defaultdict(list)
        self.on = False
        self.saved: tuple = ()

    def timed(self, name: str, f):
        @functools.wraps(f)
        def w(*a, **kw):
            if not self.on:
                return f(*a, **kw)
            t0 = time.perf_counter_ns()
            r = f(*a, **kw)
            self.times[name].append(time.perf_counter_ns() - t0)
            return r
        return w

    def launch(self, kind: str, kernel):
        first = []

        def call(*a, **kw):
            t0 = time.perf_counter_ns()
            if kind in self.saved and first:
                r = first[0]
            else:
                r = kernel(*a, **kw)
                if not first:
                    first.append(r)
            if self.on:
                self.times[f"{kind} launch call"].append(time.perf_counter_ns() - t0)
            return r
        return call

    def install(self) -> None:
        import mlx_lm.models.base as lm_base
        import mlx_lm.models.cache as lm_cache

        from ...accelerated.cache import base as cbase
        from ...accelerated.kernels import decode_step as ds
        from ..bench import gpu_clock
        resolve = ds._resolve

        def _resolve(kernel, template, **call):
            k, c = resolve(kernel, template, **call)
            name = getattr(kernel, "name", "") or ""
            kind = next((w for w in ("partial", "combine", "append") if w in name), name or "kernel")
            return self.launch(kind, k), c
        ds._resolve = _resolve
        gpu_clock.gate = self.timed("gate (the benchmark's)", gpu_clock.gate)
        cbase.VeloxKVCache.update_and_fetch = self.timed("update_and_fetch", cbase.VeloxKVCache.update_and_fetch)
        lm_cache.KVCache.update_and_fetch = self.timed("update_and_fetch", lm_cache.KVCache.update_and_fetch)
        ds.DecodeStep.step = self.timed("  DecodeStep.step", ds.DecodeStep.step)
        ds.DecodeStep.attend = self.timed("  DecodeStep.attend", ds.DecodeStep.attend)
        lm_base.scaled_dot_product_attention = self.timed("SDPA (mlx-lm's base)", lm_base.scaled_dot_product_attention)


def measure(arms, contexts, layers: int, steps: int, probe: _Probe, gated: bool = True, log=print) -> list[dict]:
    """One row per (context, arm, variant) and one wrapped row per (context, arm): medians per layer."""
    import mlx.core as mx

    from ..bench import arms as bd
    # the decode-step benchmark's step (its gate kernel between layers) on a GPU; without the gate under stand-ins
    step = functools.partial(bd.step, gated=gated)
    rows = []
    for t in contexts:
        for arm in arms:
            variants = ["as is"] if arm.startswith("fp16") else list(VARIANTS)
            for variant in variants + ["parts timed"]:
                caches = bd.make(arm, layers)
                bd.prefill(caches, t, lambda *a: None)
                pool = bd.step_inputs()
                for i in range(4):
                    mx.eval(step(caches, *pool[i % 10]))
                probe.saved = VARIANTS.get(variant, ())
                probe.times.clear()
                probe.on = variant == "parts timed"
                tb, ta, tw = [], [], []
                try:
                    for i in range(steps):
                        mx.synchronize()
                        t0 = time.perf_counter()
                        y = step(caches, *pool[i % 10])
                        t1 = time.perf_counter()
                        mx.async_eval(y)
                        t2 = time.perf_counter()
                        mx.eval(y)
                        t3 = time.perf_counter()
                        tb.append(t1 - t0)
                        ta.append(t2 - t1)
                        tw.append(t3 - t2)
                finally:
                    probe.on, probe.saved = False, ()
                row = {"context": t, "arm": arm, "variant": variant, "layers": layers, "steps": steps,
                       "build_layer_s": statistics.median(tb) / layers,
                       "async_eval_layer_s": statistics.median(ta) / layers,
                       "wait_layer_s": statistics.median(tw) / layers}
                if variant == "parts timed":
                    row["parts"] = {k: {"calls_per_step": len(v) / steps, "median_call_s": statistics.median(v) / 1e9,
                                        "per_layer_s": sum(v) / steps / layers / 1e9} for k, v in probe.times.items()}
                rows.append(row)
                log(f"{t:6d} {arm:<16} {variant:<14} build {row['build_layer_s'] * 1e6:6.1f}  async_eval "
                    f"{row['async_eval_layer_s'] * 1e6:6.1f}  wait {row['wait_layer_s'] * 1e6:6.1f} us per layer")
                for k, p in sorted(row.get("parts", {}).items(), key=lambda kv: -kv[1]["per_layer_s"]):
                    log(f"         {k:<28} {p['calls_per_step']:4.1f} calls per step, median "
                        f"{p['median_call_s'] * 1e6:6.2f} us, {p['per_layer_s'] * 1e6:6.2f} us per layer")
                del caches
                mx.clear_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="host_split", description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768])
    ap.add_argument("--arms", nargs="+", default=["fp16 KVCache", "turboquant b4", "rabitq"])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--stand-ins", action="store_true", help="no GPU: every kernel a stand-in (plumbing only)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import mlx.core as mx

    from .._env import run_record
    if args.stand_ins:
        from . import host_build
        mx.set_default_device(mx.cpu)
        host_build._stand_ins()
    elif not mx.is_available(mx.gpu):
        print("host_split: no GPU in this MLX build (--stand-ins runs the plumbing without one)", file=sys.stderr)
        return 2
    else:
        mx.set_default_device(mx.gpu)
    probe = _Probe()
    probe.install()
    rows = measure(args.arms, args.contexts, args.layers, args.steps, probe, gated=not args.stand_ins)
    res = {**run_record("python -m veloxquant.tools.dev.host_split"), "stand_ins": args.stand_ins, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
