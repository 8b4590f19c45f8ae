"""Every kernel a decode step launches on the GPU, ours and MLX's own, with its time (CUDA, under Nsight Compute).

tools/dev/gpu_timeline.py stamps our custom kernels only: a span it shows between two of them (the 8-10 µs before
each layer of kivi, turboquant_prod and the mixed pair at 32k, docs/decode-step-analysis.md, twentieth pass) is
work it cannot name. Here an arm's caches are made and prefilled as the decode-step benchmark's (tools/bench/arms.py),
a few steps run first (plans made, kernels compiled), then the CUDA driver's profiler range (cuProfilerStart /
cuProfilerStop) holds `steps` steps. Under ncu, which then records that range only:

    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file OUT.csv \\
        python3 -m veloxquant.tools.dev.step_kernels --arm 'kivi b4 (window 128)' --context 32768
    python3 -m veloxquant.tools.dev.step_kernels --summarize OUT.csv [OUT2.csv ...] --json F

Nsight Compute runs the kernels one at a time and times each alone, so the sums exceed a step's time in a chain:
read it for which kernels run, how many per layer and their shares, not for the step's time.
"""
from __future__ import annotations

import argparse
import collections
import csv
import ctypes
import io
import json
import statistics
import sys

_UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,    # ncu 2023 and older
          "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}                         # ncu 2024+ (the H100 image: "ns")


def profiler():
    """(start, stop, why): the CUDA driver's cuProfilerStart / cuProfilerStop, or no-ops and the reason."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        return lib.cuProfilerStart, lib.cuProfilerStop, None
    except OSError as e:
        return (lambda: 0), (lambda: 0), f"no CUDA driver ({e}): the range is not marked"


def run(arm: str, context: int, layers: int, steps: int, warm: int = 4, log=print) -> int:
    """The arm's decode steps, `steps` of them inside the profiler range; returns the steps run there."""
    import mlx.core as mx

    from ..bench import arms as bd
    start, stop, why = profiler()
    if why:
        log(f"step_kernels: {why}")
    pool = bd.step_inputs()
    with bd.knobs(arm):
        caches = bd.make(arm, layers)
        bd.prefill(caches, context, log)
        for i in range(warm):
            mx.eval(bd.step(caches, *pool[i % 10]))
        mx.synchronize()
        start()
        for i in range(steps):          # (bd.step gates each layer's k, v on the last output, as the benchmark)
            mx.eval(bd.step(caches, *pool[(warm + i) % 10]))
        mx.synchronize()
        stop()
    return steps


def rows(text: str) -> list[tuple[str, float]]:
    """(kernel name, µs) of each gpu__time_duration.sum row of ncu's --csv output (its ==PROF== lines skipped)."""
    lines = text.splitlines()
    head = next((i for i, s in enumerate(lines) if s.startswith('"ID"')), None)
    if head is None:
        return []
    out = []
    for r in csv.DictReader(io.StringIO("\n".join(lines[head:]))):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        scale = _UNITS.get(r.get("Metric Unit", ""), None)
        if scale is None:
            raise ValueError(f"unknown unit {r.get('Metric Unit')!r} in ncu's output")
        out.append((r["Kernel Name"], float(r["Metric Value"].replace(",", "")) * scale))
    return out


def summarize(found: list[tuple[str, float]], steps: int, layers: int) -> list[dict]:
    """Per kernel name: launches per layer step, median µs, µs per layer step; largest share first."""
    by = collections.defaultdict(list)
    for name, us in found:
        by[name].append(us)
    n = max(1, steps * layers)
    out = [{"kernel": k, "per_layer": len(v) / n, "median_us": statistics.median(v), "us_per_layer": sum(v) / n}
           for k, v in by.items()]
    return sorted(out, key=lambda r: -r["us_per_layer"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", default="turboquant b4")
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--summarize", nargs="+", default=None, metavar="CSV",
                   help="ncu --csv logs of earlier runs (each named ARM.csv or given with --labels)")
    p.add_argument("--labels", nargs="+", default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.summarize is None:
        run(a.arm, a.context, a.layers, a.steps)
        return 0
    labels = a.labels or a.summarize
    res = {}
    for label, path in zip(labels, a.summarize):
        with open(path) as f:
            res[label] = summarize(rows(f.read()), a.steps, a.layers)
        print(f"{label}:")
        for r in res[label]:
            print(f"  {r['us_per_layer']:8.2f} us/layer  {r['per_layer']:5.2f} x  {r['median_us']:8.2f} us  "
                  f"{r['kernel'][:100]}")
    if a.json:
        from .._env import run_record
        with open(a.json, "w") as f:
            json.dump({"schema": "veloxquant-step-kernels/1",
                       **run_record("python3 -m veloxquant.tools.dev.step_kernels", argv, quote=True),
                       "unit": "us, ncu's gpu__time_duration.sum (each kernel alone)", "steps": a.steps,
                       "layers": a.layers, "arms": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
