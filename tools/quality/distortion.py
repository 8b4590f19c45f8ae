"""`veloxquant distortion`: each method's distortion beside the papers' figures and bounds, and a bit-budget
recommendation.

What is measured, on which data, and how: tools/quality/distortion_measure.py (the measurement core, imported
here at module level; it imports nothing back). This module is the command: its arguments, the run (or
--update: the retrieval model's rows into an existing JSON, or --from-json: the recommendation recomputed),
the JSON, and the page through tools/quality/distortion_doc.py.

The recommendation ranks key/value pairs (methods may differ per role) whose mean stored bits per
coordinate (codes and side fields: norms, scales/zeros, the window's exact tokens where a window is set)
fit a budget, by KL(fp16 ‖ cache) of the trained model with only keys / only values quantized
(docs/quality-trained.json, summed: the JSON's both-roles rows check how well the sum predicts).

    veloxquant distortion --json docs/distortion.json --markdown docs/distortion.md   # the tracked docs
"""
from __future__ import annotations

import json
import pathlib
import sys
import time

from .budget import additivity, recommend, trained_kl
from .configs import AFFINE_GROUP, GRID, KIVI_GROUP
from .distortion_measure import (SPREAD_GRID, qjl_ablation, retrieval_activations, seed_spread, synthetic_rows,
                                 trained_activations, trained_rows)

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROG = "veloxquant distortion"   # the command its records name, however it was started

SYNTH_DIMS = (64, 128, 256)
TRAINED_DIMS = (64, 128)
# the committed retrieval model (tools/quality/retrieval_train.py COMMITTED) and its rows' data name
RETRIEVAL_MODEL = pathlib.Path(__file__).resolve().parent / "trained" / "retrieval_4m"
RETRIEVAL_DATA = "trained retrieval-4m"
BUDGETS = (2.5, 3.0, 4.0)


# ---- command ------------------------------------------------------------------------------------------------
def add_arguments(p) -> None:
    p.add_argument("--dims", nargs="+", type=int, default=list(SYNTH_DIMS),
                   help="head dims of the unit-sphere data (default 64 128 256)")
    p.add_argument("--tokens", type=int, default=1024, help="unit vectors per head (sphere data)")
    p.add_argument("--heads", type=int, default=8, help="heads of the sphere data (each its own rotation)")
    p.add_argument("--trained", nargs="*", type=int, default=list(TRAINED_DIMS),
                   help="head dims of the committed trained model to take keys/values from (none: skip)")
    p.add_argument("--sequences", type=int, default=4, help="held-out windows through the trained model")
    p.add_argument("--length", type=int, default=1024, help="bytes per held-out window")
    p.add_argument("--methods", nargs="+", default=None, help="only these methods (default: the whole grid)")
    p.add_argument("--seed", type=int, default=0, help="data and cache seed")
    p.add_argument("--spread-seeds", type=int, default=6,
                   help="seeds for the trained data's bias spread (turboquant b2, turboquant_prod b2, rabitq; "
                        "1: skip it)")
    p.add_argument("--ablation-vectors", type=int, default=25000,
                   help="unit vectors per draw of the QJL projection ablation (0: skip it)")
    p.add_argument("--quality-json", type=pathlib.Path, default=ROOT / "docs" / "quality-trained.json",
                   help="trained-model KL per role for the recommendation")
    p.add_argument("--retrieval-model", type=pathlib.Path, nargs="?", const=RETRIEVAL_MODEL, default=None,
                   metavar="DIR", help="also the keys and values of this retrieval_train export (default DIR: the "
                                       "committed retrieval-4m model), as data `trained retrieval-4m`")
    p.add_argument("--update", type=pathlib.Path, default=None, metavar="JSON",
                   help="measure only --retrieval-model and put its rows into this distortion JSON (its other "
                        "rows kept; the JSON lists the update), then re-render --markdown")
    p.add_argument("--json", type=pathlib.Path, default=None, help="write the raw results here")
    p.add_argument("--markdown", type=pathlib.Path, default=None,
                   help="write the tables here and the plot next to it (.png); needs --json")
    p.add_argument("--from-json", type=pathlib.Path, default=None, metavar="JSON",
                   help="measure nothing: recompute the recommendation from --quality-json and re-render "
                        "--markdown and its figure from this distortion JSON (rewritten in place)")


def run(args) -> int:
    from .._env import run_record

    if args.from_json is not None:
        return rerender(args)
    if args.markdown is not None and args.json is None and args.update is None:
        print("--markdown: needs --json (the page names its raw data)", file=sys.stderr)
        return 2
    for d in args.dims:
        from ... import spec

        if d not in spec.HEAD_DIMS:
            print(f"--dims: {d} is not a spec head dim", file=sys.stderr)
            return 2
    grid = [c for c in GRID if args.methods is None or c[0] in args.methods]
    if not grid:
        print(f"--methods: none of {args.methods} is in the grid", file=sys.stderr)
        return 2
    t_start = time.time()
    if args.update is not None:
        return update(args, grid)
    n_total = len(grid) * (len(args.dims) + 2 * len(args.trained) + 2 * (args.retrieval_model is not None))
    done = [0]

    def progress(r):
        done[0] += 1
        print(f"[{done[0]}/{n_total}] {r['data']:>13} {r['role']} {r['label']:<20} D_mse {r['d_mse']:.4f} "
              f"bias {r['ip_rel_bias']:+.3f} d*var {r['ip_d_var']:.4f} bits {r['bits_per_coord']:.2f} "
              f"({r['seconds']:.1f}s)", flush=True)

    rows, spread = [], []
    for d in args.dims:
        rows += synthetic_rows(d, args.tokens, args.heads, args.seed, grid, progress)
    for hd in args.trained:
        print(f"trained hd{hd}: capturing queries/keys/values of {args.sequences} x {args.length} bytes", flush=True)
        acts = trained_activations(hd, args.sequences, args.length, args.seed)
        rows += trained_rows(hd, acts, args.seed, grid, progress)
        sgrid = [c for c in SPREAD_GRID if c in grid]
        if args.spread_seeds > 1 and sgrid:
            print(f"trained hd{hd}: inner-product bias over {args.spread_seeds} seeds", flush=True)
            spread += seed_spread(hd, acts, range(args.seed, args.seed + args.spread_seeds), sgrid,
                                  lambda r: print(f"  {r['role']} {r['label']:<20} bias per seed "
                                                  + " ".join(f"{b:+.4f}" for b in r["bias"]), flush=True))
    if args.retrieval_model is not None:
        print(f"{RETRIEVAL_DATA}: capturing queries/keys/values of its recorded held-out windows", flush=True)
        acts = retrieval_activations(args.retrieval_model)
        rows += trained_rows(acts["k"][0].shape[-1], acts, args.seed, grid, progress, data=RETRIEVAL_DATA)
    ablation = []
    if args.ablation_vectors > 0 and any(m == "turboquant_prod" for m, _, _ in grid):
        print("QJL projection ablation (Gaussian S vs Hadamard), d = 64", flush=True)
        ablation = [qjl_ablation(64, b - 1, args.ablation_vectors, 16, args.seed) for b in (2, 3, 4)]
        for a in ablation:
            print(f"  prod b{a['bits']}: Gaussian S bias {a['gaussian']['bias']:+.4f} ± {a['gaussian']['se']:.4f}, "
                  f"Hadamard {a['hadamard']['bias']:+.4f} ± {a['hadamard']['se']:.4f}", flush=True)
    kl = trained_kl(args.quality_json)
    rec = recommend(kl, BUDGETS, (64, 128), rows) if kl else []
    import platform

    result = {"tool": "veloxquant distortion", **run_record(PROG, _argv(), device=_device()),
              "machine": f"{platform.machine()} {platform.node()}", "wall_s": round(time.time() - t_start, 1),
              "settings": {"dims": args.dims, "tokens": args.tokens, "heads": args.heads, "trained": args.trained,
                           "sequences": args.sequences, "length": args.length, "seed": args.seed,
                           "ablation_vectors": args.ablation_vectors, "spread_seeds": args.spread_seeds,
                           "kivi_group_size": KIVI_GROUP, "mlx_affine_group_size": AFFINE_GROUP,
                           "quality_json": str(args.quality_json.relative_to(ROOT)
                                               if args.quality_json.is_relative_to(ROOT) else args.quality_json)},
              "rows": rows, "seed_spread": spread, "qjl_ablation": ablation, "recommendation": rec, "kl_additivity": additivity(kl)}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.markdown is not None:
        from . import distortion_doc as doc

        return doc.write_docs(result, args.json, args.markdown)
    return 0


def update(args, grid) -> int:
    """--update JSON: the retrieval model's rows measured and put into an existing run's JSON (re-rendered)."""
    from .._env import command_line, utc_now_iso, versions

    if not args.update.is_file():
        print(f"--update: {args.update} does not exist", file=sys.stderr)
        return 2
    model = args.retrieval_model or RETRIEVAL_MODEL
    if not (model / "config.json").is_file():
        print(f"--retrieval-model: {model} holds no retrieval_train export (config.json)", file=sys.stderr)
        return 2
    t0 = time.time()
    res = json.loads(args.update.read_text())
    acts = retrieval_activations(model)
    n = [0]

    def progress(r):
        n[0] += 1
        print(f"[{n[0]}/{2 * len(grid)}] {r['data']} {r['role']} {r['label']:<20} D_mse {r['d_mse']:.4f} "
              f"bits {r['bits_per_coord']:.2f} ({r['seconds']:.1f}s)", flush=True)

    new = trained_rows(acts["k"][0].shape[-1], acts, args.seed, grid, progress, data=RETRIEVAL_DATA)
    res["rows"] = [r for r in res["rows"] if r["data"] != RETRIEVAL_DATA] + new
    rel = model.relative_to(ROOT) if model.is_relative_to(ROOT) else model
    res["updates"] = [u for u in res.get("updates", []) if u["data"] != RETRIEVAL_DATA] + [{
        "data": RETRIEVAL_DATA, "model": str(rel), "date": utc_now_iso(), "versions": versions(),
        "wall_s": round(time.time() - t0, 1), "command": command_line(PROG, _argv())}]
    args.update.write_text(json.dumps(res, indent=1) + "\n")
    print(f"rewrote {args.update} ({len(new)} rows of {RETRIEVAL_DATA})")
    if args.markdown is None:
        return 0
    from . import distortion_doc as doc

    return doc.write_docs(res, args.update, args.markdown)


def print_recommendation(path: pathlib.Path) -> int:
    """The recommendation table of a distortion JSON, for `veloxquant quality --recommend`."""
    if not path.is_file():
        print(f"--recommend: {path} does not exist (write it with `veloxquant distortion --json ...`)", file=sys.stderr)
        return 2
    res = json.loads(path.read_text())
    rec = [x for x in res.get("recommendation") or [] if x.get("keys")]
    if not rec:
        print(f"--recommend: {path} holds no recommendation", file=sys.stderr)
        return 2
    print(f"Best KV-cache configuration per bit budget (mean stored bits per coordinate over keys and values, "
          f"window 0), by KL of the trained byte model; from {path.name} ({res['date']}); details: "
          f"docs/distortion.md#recommendation-by-bit-budget")
    print(f"{'budget':>6} {'head dim':>8}  {'keys / values':<40} {'bits':>5} {'KL sum':>7}  flags")
    for x in rec:
        kv = f"{x['recommended_keys']} / {x['recommended_values']}"
        print(f"{x['budget']:>6} {x['head_dim']:>8}  {kv:<40} {x['recommended_bits']:>5.2f} "
              f"{x['recommended_kl_sum']:>7.4f}  {x['flags']}")
    return 0


def rerender(args) -> int:
    if args.markdown is None:
        print("--from-json: needs --markdown", file=sys.stderr)
        return 2
    if not args.from_json.is_file():
        print(f"--from-json: {args.from_json} does not exist", file=sys.stderr)
        return 2
    result = json.loads(args.from_json.read_text())
    kl = trained_kl(args.quality_json)
    result["recommendation"] = recommend(kl, BUDGETS, (64, 128), result["rows"]) if kl else []
    result["kl_additivity"] = additivity(kl)
    from .._env import command_line

    result["recommendation_command"] = command_line(PROG, _argv())
    args.from_json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"rewrote {args.from_json} (recommendation)")
    from . import distortion_doc as doc

    return doc.write_docs(result, args.from_json, args.markdown)


def _argv() -> list[str]:
    """This command's arguments, run as `veloxquant distortion ...` or as `python -m ...distortion ...`."""
    return sys.argv[2:] if len(sys.argv) > 1 and sys.argv[1] == "distortion" else sys.argv[1:]


def _device() -> str:
    import mlx.core as mx

    return str(mx.default_device())


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="veloxquant distortion", description=__doc__.splitlines()[0])
    add_arguments(ap)
    sys.exit(run(ap.parse_args()))
