"""Where a decode step's GPU time goes, kernel by kernel, in place (CUDA).

Nsight Compute times each kernel alone (serialized, caches flushed); the removed bench-decode's `GPU` column timed the whole
step. Neither says where a chain loses time that no kernel shows alone (docs/decode-step-analysis.md, ninth pass:
the append inside the partial launch was shorter alone and 12-20 µs per layer slower in the chain). Here every
custom kernel the step launches (ours, the layer gate) is followed by a stamp (tools/bench/gpu_clock.py stamp: a one-thread
kernel reading the launch's first output and %globaltimer), the whole step queued behind one hold, so each launch
gets the GPU time at which its output was complete; the difference between consecutive stamps of a layer is that
launch's share of the chain, gaps and launch latency included. The stamps are extra kernels off the chain (nothing
waits for them) and cost ~1-2 µs of latency each on the H200: compare arms in one run, not with the benchmarks.

    python3 -m veloxquant.tools.dev.gpu_timeline --context 4096 --arms 'turboquant b4 [FUSE_APPEND=0]' 'turboquant b4'

Kernels are recorded by wrapping mx.fast.cuda_kernel before any kernel object exists, so run it in a process of
its own (fp16's SDPA and slice updates are MLX's own kernels: not recorded).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys

import mlx.core as mx

from ..bench import gpu_clock


class Recorder:
    """Wraps a custom-kernel factory (mx.fast.cuda_kernel): while `on`, each launch of a kernel it made appends
    (kernel name, stamp of its first output) to `marks`. The clock's own kernels are not wrapped."""

    def __init__(self, stamp=None):
        self.on = False
        self.marks: list[tuple[str, mx.array]] = []
        self._stamp = stamp or gpu_clock.stamp

    def wrap(self, make):
        def factory(*args, **kw):
            kernel = make(*args, **kw)
            name = kw.get("name") or (args[0] if args else "?")
            if name.startswith("vq_clock"):
                return kernel

            def launch(**call):
                outs = kernel(**call)
                if self.on:
                    self.marks.append((name, self._stamp(outs[0])))
                return outs
            return launch
        return factory


def short(name: str) -> str:
    """A kernel's name without its template tag (backend.CudaKernel's 10 hex digits) and sizes."""
    name = re.sub(r"_[0-9a-f]{10}$", "", name)
    return re.sub(r"^(vq_gate)_.*$", r"\1", name)


def spans(t0: int, marks: list[tuple[str, int]]) -> list[tuple[str, float, float]]:
    """(kernel, µs since t0 at its stamp, µs since the previous stamp) in launch order."""
    out, prev = [], t0
    for name, t in marks:
        out.append((short(name), (t - t0) * 1e-3, (t - prev) * 1e-3))
        prev = t
    return out


def layers(rows: list[tuple[str, float, float]]) -> list[list[tuple[str, float]]]:
    """The rows split per layer: a layer ends at its combine (or its partial where the combine is fused)."""
    out, cur = [], []
    for name, _, d in rows:
        cur.append((name, d))
        if "combine" in name:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def chained_gate(rec: Recorder):
    """A layer gate whose stamp the layer waits for: the gate's copies, a stamp of them, and a second gate (not
    recorded) on that stamp. A recorded stamp is off the chain: behind a gate, the next launch (a partial whose
    blocks fill every SM) can start first and hold it back, so the gate's row takes part of the partial's time.
    Chained, the gate's row ends when the gate did, and the second gate (a small copy) joins the partial's row."""
    def gate(arrays, dep):
        outs = gpu_clock.gate(arrays, dep)
        t = gpu_clock.stamp(outs[0])
        rec.marks[-1] = (rec.marks[-1][0], t)
        on, rec.on = rec.on, False
        outs = gpu_clock.gate(outs, t)
        rec.on = on
        return outs
    return gate


def measure(arms: list[str], context: int, n_layers: int, steps: int, log=print, chain: bool = False) -> dict:
    """Per arm, per layer and kernel: the median over `steps` steps of that launch's share of the chain (µs);
    `chain`: the gates' stamps in the chain (chained_gate)."""
    from ..bench import arms as bd
    rec = Recorder()
    mx.fast.cuda_kernel = rec.wrap(mx.fast.cuda_kernel)
    result = {}
    pool = bd.step_inputs()
    for arm in arms:
        with bd.knobs(arm):
            caches = bd.make(arm, n_layers)
            bd.prefill(caches, context, log)
            for i in range(4):                       # plans made, kernels compiled
                mx.eval(bd.step(caches, *pool[i % 10]))
            per_step = []
            for i in range(steps):
                th = gpu_clock.hold()
                q, k, v = gpu_clock.gate(list(pool[i % 10]), th)
                rec.marks, rec.on = [], True
                y = bd.step(caches, q, k, v, gate=chained_gate(rec) if chain else None)
                rec.on = False
                te = gpu_clock.stamp(y)
                mx.eval(th, te, y, *[m for _, m in rec.marks])
                t0 = int(th.item())
                rows = spans(t0, [(n, int(m.item())) for n, m in rec.marks] + [("end", int(te.item()))])
                per_step.append(layers(rows[:-1]))
                per_step[-1].append([("total", rows[-1][1] / n_layers)])
        table = []
        for li in range(len(per_step[0])):
            table.append([(per_step[0][li][j][0], statistics.median(s[li][j][1] for s in per_step))
                          for j in range(len(per_step[0][li]))])
        result[arm] = table
        log(f"{arm} at {context}:")
        for li, row in enumerate(table):
            log(f"  {'layer ' + str(li) if row[0][0] != 'total' else 'per layer':9s} "
                + "  ".join(f"{n} {d:.1f}" for n, d in row))
        del caches
        mx.clear_cache()
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", nargs="+", default=["turboquant b4 [FUSE_APPEND=0]", "turboquant b4"])
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--chain", action="store_true", help="the layer gates' stamps in the chain (chained_gate)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    ok, why = gpu_clock.available()
    if not ok:
        print(f"gpu_timeline: {why}", file=sys.stderr)
        return 2
    mx.set_default_device(mx.gpu)
    res = measure(a.arms, a.context, a.layers, a.steps, chain=a.chain)
    if a.json:
        with open(a.json, "w") as f:
            from .._env import run_record
            json.dump({"schema": "veloxquant-gpu-timeline/1",
                       **run_record("python3 -m veloxquant.tools.dev.gpu_timeline", argv, quote=True),
                       "unit": "us: per layer and launch, the median over steps of the time from the previous "
                               "launch's stamp to this one's",
                       "context": a.context, "layers": a.layers, "steps": a.steps, "chain": a.chain, "arms": res},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
