"""The graph a decode step builds besides its kernel launches, per arm, without a GPU: each node costs the host a
build and an encode per layer per token (twentieth pass: an exact window's four views, +28 µs of build and +14 of
encode per layer on the H100's host), so this is the part of the host's time a change can add or remove.

    python -m veloxquant.tools.dev.step_nodes [--arms 'turboquant b4' ...] [--context 4096] [--layers 2] [--batch B]
                                              [--json F]

Run it as its own process: the kernels are tools/dev/host_build.py's stand-ins (ready outputs), so what the step's
graph still holds is what Python and MLX build around the launches. One step after warm-up steps whose launch
inputs are evaluated, as a GPU run evaluates them; the launches' inputs exported with mx.export_to_dot; per layer
the launches by kernel, the other nodes by primitive, and which launch input each one feeds. An arm of mlx-lm's
own ("fp16 KVCache") lists its whole step, SDPA included (on the CPU MLX's SDPA is several ops; on a GPU, one).
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile

DEFAULT_ARMS = ("turboquant b4", "turboquant b4 (window 32)", "kivi b2 (window 0)", "kivi b4 (window 128)",
                "turboquant_prod b4", "turboquant_rvq 2+2", "rabitq", "mlx_affine b4",
                "keys turboquant b3 + values kivi b2")
_LABEL = re.compile(r'label\s*=\s*"([^"]*)"')


def nodes_of(arrays) -> list[str]:
    """The primitives (mx.export_to_dot's node labels) of the graph that `arrays` still hold, one per node."""
    import mlx.core as mx
    if not arrays:
        return []
    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mx.export_to_dot(f.name, *arrays)
        return [lab.split()[0] for lab in _LABEL.findall(f.read())]


def _recorder(seen: list):
    """Wraps the stand-in kernel class so that each launch records (kernel name, input names, inputs)."""
    from ...accelerated.kernels import backend
    stand_in = backend.cuda_kernel

    class Recorded(stand_in):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.input_names = list(kw.get("input_names", ()))

        def __call__(self, inputs, output_shapes, output_dtypes, **kw):
            seen.append((self.name, list(self.input_names), list(inputs)))
            return super().__call__(inputs, output_shapes, output_dtypes, **kw)
    backend.cuda_kernel = Recorded
    backend.kernel = lambda *a: Recorded()


def _caches(arm: str, context: int, layers: int, batch: int) -> list:
    """One cache per layer; with `batch` > 1 the merge of `batch` sequences of context, context - 17, ... tokens
    (mlx-lm's batch merge, as the batch benchmark's ragged prompts: our B-row or ragged cache where eligible)."""
    from ..bench import arms as bd
    seqs = []
    for i in range(batch):
        caches = bd.make(arm, layers)
        bd.prefill(caches, max(1, context - 17 * i), lambda *a: None)
        seqs.append(caches)
    return seqs[0] if batch == 1 else [seqs[0][j].merge([s[j] for s in seqs]) for j in range(layers)]


def measure(arms, context: int, layers: int, warm: int = 4, batch: int = 1) -> list[dict]:
    """One row per arm: launches and other nodes per layer, and the launch inputs the other nodes feed."""
    import mlx.core as mx

    from ..bench import arms as bd
    rows, seen = [], []
    _recorder(seen)         # once: compiled-kernel objects are cached across arms, each holding this list
    for arm in arms:
        with bd.knobs(arm):     # (an arm's knobs, in effect while its steps are built)
            caches = _caches(arm, context, layers, batch)
            pool = bd.step_inputs(2, batch)
            for i in range(warm + 1):
                seen.clear()
                out = bd.step(caches, *pool[i % 2], gated=False)     # (the gate cannot run on stand-ins)
                if i < warm:        # a GPU run evaluates every launch input (the record buffers made at a plan, ...)
                    mx.eval(out, *[a for _, _, xs in seen for a in xs])
        launches = collections.Counter(name for name, _, _ in seen)
        # (mlx-lm's own caches launch none of ours: their whole step's graph, MLX's SDPA included)
        other = collections.Counter(nodes_of([a for _, _, xs in seen for a in xs] if seen else [out]))
        feeds = collections.Counter(f"{name}.{n}" for name, names, xs in seen for n, a in zip(names, xs)
                                    if nodes_of([a]))
        mx.eval(out, *[a for _, _, xs in seen for a in xs])
        rows.append({"arm": arm, "layers": layers, "context": context, "batch": batch,
                     "cache": type(caches[0]).__name__,
                     "launches_per_layer": {k: v / layers for k, v in sorted(launches.items())},
                     "nodes_per_layer": {k: v / layers for k, v in sorted(other.items())},
                     "total_nodes_per_layer": sum(other.values()) / layers,
                     "inputs_fed": dict(sorted(feeds.items()))})
    return rows


def render(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        nodes = ", ".join(f"{k} {v:g}" for k, v in r["nodes_per_layer"].items()) or "none"
        out.append(f"{r['arm']:<40} {r['cache']}: launches {sum(r['launches_per_layer'].values()):g}, other nodes "
                   f"{r['total_nodes_per_layer']:g} per layer ({nodes})")
        if r["inputs_fed"]:
            out.append(" " * 42 + "feeding " + ", ".join(r["inputs_fed"]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="step_nodes", description=__doc__.splitlines()[0])
    ap.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS))
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1, help="sequences merged into a batch (ragged prompts)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from .host_build import _stand_ins
    _stand_ins()
    rows = measure(a.arms, a.context, a.layers, batch=a.batch)
    print("\n".join(render(rows)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"schema": "veloxquant-step-nodes/1", "command": " ".join(["step_nodes", *sys.argv[1:]]),
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
