"""The host's build of one decode step per layer, measured without a GPU: tools/bench/arms.py's step (update_and_fetch +
the hooked attention, no gate) over arms.make's caches with every kernel a stand-in (tools/dev/host_build.py's), so
the time is Python and MLX graph calls only; each step's outputs and launch inputs are evaluated outside the timer, as
a GPU run evaluates them. Min and median per layer over many steps, and with --profile a cProfile listing of one
arm's steps (where a windowed step's build goes).

    python -m veloxquant.tools.dev.step_build [--arms ...] [--context 4096] [--layers 8] [--steps 300] [--rounds 3]
                                              [--profile 'turboquant b4 (window 32)'] [--json F]

Run it as its own process (the stand-ins replace this process's kernels). Rounds alternate the arms, so a neighbour
process's load falls on all of them; the median of the rounds' medians is the number to compare.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time

DEFAULT_ARMS = ("fp16 KVCache", "turboquant b4", "turboquant b4 (window 32)", "kivi b4 (window 128)",
                "kivi b2 (window 0)", "keys turboquant b3 + values kivi b2")


def _setup(arm: str, context: int, layers: int, warm: int):
    """An arm's caches prefilled with `context` tokens, warmed up by `warm` evaluated steps, and its step."""
    import mlx.core as mx

    from ..bench import arms as bd
    caches = bd.make(arm, layers)
    bd.prefill(caches, context, lambda *a: None)
    pool = bd.step_inputs(4, 1)
    for i in range(warm):
        mx.eval(bd.step(caches, *pool[i % 4], gated=False))
    return caches, pool


def _timed(caches, pool, steps: int, layers: int, seen: list) -> list[float]:
    """Build times of `steps` steps, s per layer; each step evaluated after its timer stops."""
    import mlx.core as mx

    from ..bench import arms as bd
    ts = []
    for i in range(steps):
        seen.clear()
        t0 = time.perf_counter()
        out = bd.step(caches, *pool[i % 4], gated=False)
        ts.append((time.perf_counter() - t0) / layers)
        mx.eval(out, *[a for _, _, xs in seen for a in xs])
    return ts


def measure(arms, context: int, layers: int, steps: int, rounds: int, log=print) -> list[dict]:
    """One row per arm: min / median build per layer (µs) per round and over the rounds."""
    from ..bench import arms as bd
    from .step_nodes import _recorder
    seen: list = []
    _recorder(seen)
    per = {a: [] for a in arms}
    for r in range(rounds):
        for arm in arms:
            with bd.knobs(arm):     # (an arm's knobs, in effect while its steps are built)
                caches, pool = _setup(arm, context, layers, 8)
                ts = _timed(caches, pool, steps, layers, seen)
            per[arm].append((min(ts) * 1e6, statistics.median(ts) * 1e6))
            log(f"round {r + 1} {arm:<40} min {per[arm][-1][0]:6.1f}  median {per[arm][-1][1]:6.1f} us per layer")
    return [{"arm": a, "rounds": v, "min_us": min(x for x, _ in v),
             "median_us": statistics.median(m for _, m in v)} for a, v in per.items()]


def profile(arm: str, context: int, layers: int, steps: int, top: int = 30) -> str:
    """cProfile of `steps` step builds of `arm` (evaluation outside the profiler), sorted by own time."""
    from .step_nodes import _recorder
    seen: list = []
    _recorder(seen)
    import mlx.core as mx

    from ..bench import arms as bd
    prof = cProfile.Profile()
    with bd.knobs(arm):
        caches, pool = _setup(arm, context, layers, 8)
        for i in range(steps):
            seen.clear()
            prof.enable()
            out = bd.step(caches, *pool[i % 4], gated=False)
            prof.disable()
            mx.eval(out, *[a for _, _, xs in seen for a in xs])
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    return s.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="step_build", description=__doc__.splitlines()[0])
    ap.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS))
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", default=None, help="an arm to profile instead of timing the arms")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import mlx.core as mx
    mx.set_default_device(mx.cpu)
    from .host_build import _stand_ins
    _stand_ins()
    if a.profile:
        print(profile(a.profile, a.context, a.layers, a.steps))
        return 0
    rows = measure(a.arms, a.context, a.layers, a.steps, a.rounds)
    for r in rows:
        print(f"{r['arm']:<40} min {r['min_us']:6.1f}  median {r['median_us']:6.1f} us per layer")
    if a.json:
        from .._env import run_record
        with open(a.json, "w") as f:
            json.dump({**run_record("python -m veloxquant.tools.dev.step_build"), "context": a.context,
                       "layers": a.layers, "steps": a.steps, "rows": rows}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
