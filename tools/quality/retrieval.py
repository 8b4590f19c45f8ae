"""The quality table on the retrieval model (issue 32 item 2): perplexity, passkey retrieval over context and
needle depth, and KL against fp16, for every cache, in one budgeted run.

The model is a run folder exported by tools/quality/retrieval_train.py (`export`: config.json and float16
shards model-NN.safetensors), loaded as an mlx-lm llama. Evaluation sequences are the trainer's passkey
format (PASSKEY_PREFIX, DIGITS; held-out corpus text with `PASSKEY = 12345` at a line start and the query
`PASSKEY = ` plus the digits at the end), with the needle depth set instead of drawn. Each cache reads a
sequence as generate_step would: prefill in chunks of `--chunk` bytes up to the answer, then the answer one
byte per call, teacher-forced (argmax at each digit given the correct prefix = greedy decoding). Per cell:
- perplexity: exp(mean next-byte NLL) over the text positions (not the needle line, query or answer);
- KL(p_fp16 || p_cache), float64, mean and 99th percentile over those positions, and its mean over the 5
  answer positions;
- retrieval: exact match of the 5 digits, per sequence with its needle depth.
Configurations: mlx-lm's KVCache (fp16, the reference) and QuantizedKVCache (q8, q4), and every method and
bit width of GRID with keys and values (`kv`), keys only (`k`), values only (`v`) and `kv` with a window of
WINDOW exact newest tokens (`kv+window`). A second model variant, `outliers`, scales a few key channel pairs
by fixed random factors (and the matching query channels by the inverse, so the fp16 model computes the same
function): the caches see keys with outlier channels, which is what the rotation is for.

Budget: the work is cut in rounds (one sequence at one context through every configuration of a tier); the
tiers (plain `kv` + baselines, plain `k`/`v`/`kv+window`, outlier model) get shares of `--budget-seconds`,
and a round runs only if its estimated time (measured on earlier rounds) fits; the first tier's first round
at each context only has to fit the whole budget. Cells report how many
sequences they saw. `python -m veloxquant.tools.quality.retrieval_doc` renders the markdown from the JSON.

The run plans (make_plan), measures (measure: tiers, rounds, configurations) and writes (write). Its parts:
retrieval_sequences.py (the passkey sequences), retrieval_model.py (loading, the outlier variant, the keys'
statistics), retrieval_score.py (logits and the per-row scores).

    python -m veloxquant.tools.quality.retrieval run [--model-dir MODEL] [--corpus corpus.npz] \\
        --contexts 1024 4096 16384 32768 --budget-seconds 270 --json out.json [--markdown out.md]
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import platform
import sys
import time
import typing

import numpy as np

from . import retrieval_data as qrd
from .retrieval_train import COMMITTED
from .retrieval_model import OUTLIER_PAIRS, OUTLIER_SCALE, inject_outliers, key_table, load_model
from .retrieval_score import forward, score
from .retrieval_sequences import passkey_sequence

GRID = ([("turboquant", b, None) for b in (2, 3, 4)]
        + [("turboquant_rvq", b, b2) for b, b2 in ((2, 1), (2, 2), (3, 1))]
        + [("turboquant_prod", b, None) for b in (2, 3, 4)]
        + [("kivi", b, None) for b in (2, 4)]
        + [("rabitq", 1, None)]
        + [("mlx_affine", b, None) for b in (4, 8)])
WINDOW = 128
VARIANTS = {"kv": ("kv", 0), "k": ("k", 0), "v": ("v", 0), "kv+window": ("kv", WINDOW)}   # name: (roles, window)
BASELINES = ("fp16", "mlx_q8", "mlx_q4")
# The needle depths in the order rounds use them: any prefix spreads over the depth range.
DEPTHS = (0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6)
# tier: (model variant, cache variants, budget share)
TIERS = {"main": ("plain", ("kv",), 0.45), "roles": ("plain", ("k", "v", "kv+window"), 0.3),
         "outliers": ("outliers", ("kv", "k"), 0.25)}


# ---- caches ---------------------------------------------------------------------------------------------
def configs(variants) -> list[dict]:
    from .trained_eval import configs_for

    out = []
    for c in configs_for((), []):     # fp16, mlx_q8, mlx_q4
        out.append({**c, "variant": c["variant"] if c["method"] == "fp16" else "kv"})
    for v in variants:
        roles, window = VARIANTS[v]
        out += [{"method": m, "bits": b, "bits2": b2, "variant": v, "roles": roles, "fp16_layers": (0, 0),
                 "window": window} for m, b, b2 in GRID]
    return out


def label(cfg: dict) -> str:
    if cfg["method"] in BASELINES:
        return cfg["method"]
    b = f"{cfg['bits']}+{cfg['bits2']}" if cfg["bits2"] else str(cfg["bits"])
    return f"{cfg['method']}/{b}/{cfg['variant']}"


def make_caches(model, cfg: dict, seed: int, mlx_q_native: bool) -> list:
    """The configuration's caches (tools/quality/caches.py), with mlx-lm's QuantizedKVCache at group size
    min(64, head_dim), behind the float16 boundary when the model computes in float32."""
    import mlx.core as mx
    from mlx_lm.models.cache import QuantizedKVCache

    from .caches import DequantizedQuantizedKVCache, Float16KV, _make_caches

    f16 = model.layers[0].self_attn.q_proj.weight.dtype == mx.float16
    if cfg["method"].startswith("mlx_q"):
        g = min(64, model.layers[0].self_attn.head_dim)
        if mlx_q_native:
            caches = [QuantizedKVCache(group_size=g, bits=cfg["bits"]) for _ in model.layers]
        else:
            caches = [DequantizedQuantizedKVCache(cfg["bits"], g) for _ in model.layers]
    else:
        caches = _make_caches(model, cfg, seed, attention="dequantize")
    return caches if f16 or (mlx_q_native and cfg["method"].startswith("mlx_q")) else [Float16KV(c) for c in caches]


# ---- the run's state and its JSON -----------------------------------------------------------------------
class Budget:
    """Round time estimates: measured per (tier, context), else scaled from the nearest shorter context
    measured by (context ratio)^1.5 (attention is quadratic in context, the rest linear)."""

    def __init__(self):
        self.seen: dict[tuple[str, int], float] = {}

    def estimate(self, tier: str, ctx: int, n_configs: int, per_config: dict[int, float]) -> float | None:
        if (tier, ctx) in self.seen:
            return self.seen[(tier, ctx)]
        shorter = [c for c in per_config if c <= ctx]
        if not shorter:
            return None
        c0 = max(shorter)
        return per_config[c0] * n_configs * (ctx / c0) ** 1.5


class Plan(typing.NamedTuple):
    """What a run settles before it measures: where and in what dtype, the models, the corpus, the sequences and the
    keys' statistics."""
    t_start: float
    device: str
    dtype: object
    mlx_q_native: bool
    models: dict          # model variant -> model
    cfg_json: dict        # the model's run configuration
    corpus: dict
    corpus_match: bool
    tiers: list
    outlier_info: list | None
    seqs: dict            # (context, round) -> sequence, the same for every configuration and model variant
    stats: dict           # model variant -> key_table
    setup_s: float


@dataclasses.dataclass
class Tally:
    """What the measuring gathers, round by round."""
    cells: dict = dataclasses.field(default_factory=dict)    # (model, label, ctx) -> accumulators
    refs: dict = dataclasses.field(default_factory=dict)     # (model, ctx, round) -> fp16 score
    budget: Budget = dataclasses.field(default_factory=Budget)
    per_config: dict = dataclasses.field(default_factory=dict)  # ctx -> s per configuration per sequence (warm runs)
    warm: set = dataclasses.field(default_factory=set)   # (model, label) run before: kernels compiled, time typical
    skipped: list = dataclasses.field(default_factory=list)
    errors: list = dataclasses.field(default_factory=list)


def result_dict(args, plan: Plan, tally: Tally, partial: bool) -> dict:
    """The JSON: run (where, when, versions), settings, model, corpus, key statistics and one row per cell."""
    from .. import _env

    rows = [_row(key, c) for key, c in tally.cells.items()]
    wall = time.time() - plan.t_start
    cfg_json = plan.cfg_json
    rec = _env.run_record("python -m veloxquant.tools.quality.retrieval", args.argv or None, device=plan.device)
    result = {   # the shared record split: the command on top, the rest under "run"
        "tool": "python -m veloxquant.tools.quality.retrieval run",
        "command": rec["command"],
        "run": {"date": rec["date"], "device": rec["device"], "host": platform.node(),
                "gpu": os.environ.get("VELOXQUANT_GPU_NAME") or _gpu_name(), "versions": rec["versions"],
                "wall_s": round(wall, 1), "partial": partial, "setup_s": round(plan.setup_s, 1),
                "budget_s": args.budget_seconds},
        "settings": {"contexts": args.contexts, "first_round": args.first_round,
                     "max_sequences": args.max_sequences, "chunk": args.chunk,
                     "seed": args.seed, "dtype": str(plan.dtype), "mlx_q_native": plan.mlx_q_native,
                     "tiers": plan.tiers,
                     "tier_defs": {t: {"model": m, "variants": list(v), "share": s} for t, (m, v, s) in TIERS.items()},
                     "grid": [list(g) for g in GRID], "window": WINDOW, "depths": list(DEPTHS),
                     "kivi_group_size": 32, "mlx_affine_group_size": 32, "cache_attention": "dequantize",
                     "outliers": {"pairs_per_kv_head": OUTLIER_PAIRS, "scale": list(OUTLIER_SCALE),
                                  "layers": plan.outlier_info}},
        "model": {"dir": str(args.model_dir), **{k: cfg_json.get(k) for k in
                                                  ("preset", "step", "total", "parameters", "model_args", "seed",
                                                   "commands", "corpus")}},
        "corpus": {**plan.corpus["manifest"], "matches_model": plan.corpus_match},
        "key_statistics": plan.stats, "skipped_rounds": tally.skipped, "errors": list(tally.errors),
        "results": rows,
    }
    return result


def _row(key: tuple, c: dict) -> dict:
    """One cell's row of the JSON from its accumulators."""
    model_name, lab, ctx = key
    nll = np.concatenate(c["nll"])
    kl = np.concatenate(c["kl"]) if c["kl"] else np.zeros(1)
    kla = np.concatenate(c["kl_answer"]) if c["kl_answer"] else np.zeros(1)
    cfg = c["cfg"]
    return {"model": model_name, "label": lab, "method": cfg["method"], "bits": cfg["bits"],
            "bits2": cfg["bits2"], "variant": cfg["variant"], "window": cfg["window"], "context": ctx,
            "sequences": len(c["seqs"]), "retrieval": float(np.mean([s["hit"] for s in c["seqs"]])),
            "hits": int(sum(s["hit"] for s in c["seqs"])), "nll": float(nll.mean()),
            "ppl": float(np.exp(nll.mean())), "kl_mean": float(kl.mean()),
            "kl_p99": float(np.percentile(kl, 99)), "kl_answer_mean": float(kla.mean()),
            "bits_per_coord": float(np.mean([b[0] for b in c["bits"]])),
            "role_bits_per_coord": float(np.mean([b[1] for b in c["bits"]])), "per_sequence": c["seqs"]}


def summary(rows: list[dict]) -> None:
    """One line per (model, configuration): hits/sequences per context and KL mean at the longest one."""
    ctxs = sorted({r["context"] for r in rows})
    by = {(r["model"], r["label"], r["context"]): r for r in rows}
    print(f"{'model':<9} {'configuration':<30}" + "".join(f"{c:>10}" for c in ctxs) + "   KL mean (longest)")
    for m, lab in dict.fromkeys((r["model"], r["label"]) for r in rows):
        cells = [by.get((m, lab, c)) for c in ctxs]
        last = next((x for x in reversed(cells) if x), None)
        print(f"{m:<9} {lab:<30}" + "".join(f"{x['hits']:>6}/{x['sequences']:<3}" if x else f"{'-':>10}" for x in cells)
              + f"   {last['kl_mean']:.2e}", flush=True)



def write_json(path: pathlib.Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)


def run(args) -> int:
    """Plan (models, corpus, sequences), measure (the tiers' rounds within the budget), write (JSON, page)."""
    t_start = time.time()
    plan = make_plan(args, t_start)
    tally = measure(args, plan)
    return write(args, plan, tally)


# ---- plan -----------------------------------------------------------------------------------------------
def make_plan(args, t_start: float) -> Plan:
    """The device and dtype, the models (the outlier variant if a tier needs it), the corpus, the sequences and the
    keys' statistics; says what it planned."""
    import mlx.core as mx

    if args.device == "cpu":
        mx.set_default_device(mx.cpu)
    device = str(mx.default_device())
    on_gpu = "gpu" in device
    dtype = {"float16": mx.float16, "float32": mx.float32}[args.dtype or ("float16" if on_gpu else "float32")]
    mlx_q_native = on_gpu if args.mlx_q_native is None else args.mlx_q_native
    models = {}
    base, cfg_json = load_model(args.model_dir, dtype)
    corpus = qrd.load_corpus(args.corpus)
    models["plain"] = base
    corpus_match = cfg_json.get("corpus", {}).get("sha256") == corpus["manifest"]["sha256"]
    if not corpus_match:
        print(f"warning: --corpus {corpus['manifest']['sha256'][:12]} is not the model's training corpus "
              f"({cfg_json.get('corpus', {}).get('sha256', '?')[:12]}): the held-out text may overlap its training "
              "text", file=sys.stderr, flush=True)
    tiers = [t for t in TIERS if t in args.tiers]
    outlier_info = None
    if any(TIERS[t][0] == "outliers" for t in tiers):
        models["outliers"], _ = load_model(args.model_dir, dtype)
        outlier_info = inject_outliers(models["outliers"], args.seed)
    seqs, stat_seqs = _sequences(args, corpus["heldout"])
    stats = {name: key_table(m, stat_seqs) for name, m in models.items()}
    setup_s = time.time() - t_start
    print(f"quality-retrieval: {cfg_json.get('preset')} ({cfg_json.get('parameters', 0):,} parameters, step "
          f"{cfg_json.get('step')}/{cfg_json.get('total')}), {device}, {dtype}, contexts {args.contexts}, budget "
          f"{args.budget_seconds:.0f}s, tiers {tiers}; setup {setup_s:.1f}s", flush=True)
    return Plan(t_start, device, dtype, mlx_q_native, models, cfg_json, corpus, corpus_match, tiers, outlier_info,
                seqs, stats, setup_s)


def _sequences(args, text: np.ndarray) -> tuple[dict, list]:
    """({(context, round): sequence}, the two sequences the keys' statistics read)."""
    seqs = {}
    for ctx in args.contexts:
        for r in range(args.first_round, args.max_sequences):
            rng = np.random.default_rng([args.seed, ctx, r])
            seqs[(ctx, r)] = passkey_sequence(text, ctx, rng, DEPTHS[r % len(DEPTHS)])
    stat_ctx = min(args.contexts + [2048])
    stat_seqs = [passkey_sequence(text, stat_ctx, np.random.default_rng([args.seed, 1, i]), 0.5) for i in range(2)]
    return seqs, stat_seqs


# ---- measure --------------------------------------------------------------------------------------------
def measure(args, plan: Plan) -> Tally:
    """Every tier in turn, each within its share of the budget plus what the tiers before it left unused."""
    tally = Tally()
    pool = max(0.0, args.budget_seconds - plan.setup_s - args.reserve_seconds)
    carry = 0.0
    for tier in plan.tiers:
        tier_budget = pool * TIERS[tier][2] / sum(TIERS[t][2] for t in plan.tiers) + carry
        carry = max(0.0, tier_budget - _measure_tier(args, plan, tally, tier, tier_budget))
    return tally


def _measure_tier(args, plan: Plan, tally: Tally, tier: str, tier_budget: float) -> float:
    """The tier's rounds (one sequence at one context through its configurations), round by round over the
    contexts; a round whose estimated time would not fit is skipped (and listed). Returns the seconds it took."""
    model_name, variants, _ = TIERS[tier]
    tier_cfgs = configs(variants)
    if tier == "roles":
        tier_cfgs = [c for c in tier_cfgs if c["method"] not in BASELINES]
    deadline = plan.t_start + args.budget_seconds - args.reserve_seconds
    tier_t0 = time.time()
    for r in range(args.first_round, args.max_sequences):
        for ctx in args.contexts:
            need_ref = (model_name, ctx, r) not in tally.refs and tier_cfgs[0]["method"] != "fp16"
            est = tally.budget.estimate(tier, ctx, len(tier_cfgs) + int(need_ref), tally.per_config)
            used = time.time() - tier_t0
            late = time.time() >= deadline
            # the first tier's first sequence at every context may use the whole budget: every context
            # gets its fp16 / q8 / q4 / kv cells before anything else is measured
            cap = float("inf") if (tier == plan.tiers[0] and r == args.first_round) else tier_budget
            if late or (est is not None and (used + est > cap or time.time() + est > deadline)):
                tally.skipped.append({"tier": tier, "context": ctx, "round": r,
                                      "estimate_s": None if est is None else round(est, 1)})
                continue
            todo = ([configs(())[0]] if need_ref else []) + tier_cfgs
            _measure_round(args, plan, tally, tier, model_name, todo, ctx, r)
    return time.time() - tier_t0


def _measure_round(args, plan: Plan, tally: Tally, tier: str, model_name: str, todo: list, ctx: int, r: int):
    """One sequence at one context through `todo`'s configurations, then the JSON so far and a progress line."""
    t_round, all_warm = time.time(), True
    deadline = plan.t_start + args.budget_seconds - args.reserve_seconds
    ran = 0
    for k, cfg in enumerate(todo):
        if k and time.time() + tally.per_config.get(ctx, 0.0) > deadline:
            tally.skipped.append({"tier": tier, "context": ctx, "round": r, "cut_after_configs": k})
            break     # the hard deadline: the round stops part way (cells count their sequences)
        try:
            dt, was_warm = measure_config(args, plan, tally, model_name, cfg, ctx, r)
        except Exception as e:   # one failing cache must not cost the rest of the run: say it, go on
            if cfg["method"] == "fp16":
                raise
            tally.errors.append({"model": model_name, "label": label(cfg), "context": ctx, "round": r,
                                 "error": f"{type(e).__name__}: {e}"[:500]})
            print(f"error: {model_name} {label(cfg)} ctx {ctx}: {tally.errors[-1]['error']}", flush=True)
            continue
        all_warm &= was_warm
        ran += 1
        if was_warm:   # a first run compiles kernels: its time says nothing about the next ones
            pc = tally.per_config
            pc[ctx] = dt if ctx not in pc else 0.5 * (pc[ctx] + dt)
    dt = time.time() - t_round
    if all_warm:
        tally.budget.seen[(tier, ctx)] = max(dt, tally.budget.seen.get((tier, ctx), 0.0))
    if args.json:   # after every round, so a run stopped from outside still leaves its cells
        write_json(args.json, result_dict(args, plan, tally, partial=True))
    fp = tally.cells[(model_name, "fp16", ctx)]["seqs"]
    print(f"[{time.time() - plan.t_start:6.1f}s] {tier:<8} ctx {ctx:>6} round {r} depth {DEPTHS[r % len(DEPTHS)]:.1f}: "
          f"{ran}/{len(todo)} configs in {dt:.1f}s; fp16 retrieval so far {sum(s['hit'] for s in fp)}/{len(fp)}",
          flush=True)


def measure_config(args, plan: Plan, tally: Tally, model_name: str, cfg: dict, ctx: int, r: int):
    """(seconds, whether this (model, configuration) ran before) of one sequence through one configuration's
    caches, its scores added to the cell (the fp16 ones kept as the round's reference)."""
    from .caches import cache_bits

    seq = plan.seqs[(ctx, r)]
    key = (model_name, ctx, r)
    model = plan.models[model_name]
    t0 = time.time()
    caches = make_caches(model, cfg, args.seed, plan.mlx_q_native)
    sc = score(forward(model, caches, seq["tokens"], args.chunk), seq,
               None if cfg["method"] == "fp16" else tally.refs[key])
    if cfg["method"] == "fp16":
        tally.refs[key] = sc
    at = model.layers[0].self_attn
    bits = cache_bits(caches, at.n_kv_heads * at.head_dim, seq["tokens"].size - 1)
    c = tally.cells.setdefault((model_name, label(cfg), ctx), {"cfg": cfg, "nll": [], "kl": [], "kl_answer": [],
                                                               "seqs": [], "bits": []})
    c["nll"].append(sc["nll"])
    if "kl" in sc:
        c["kl"].append(sc["kl"])
        c["kl_answer"].append(sc["kl_answer"])
    c["bits"].append(bits)
    c["seqs"].append({"round": r, "depth": seq["depth"], "needle_at": seq["needle_at"], "hit": sc["hit"],
                      "answer_nll": round(sc["answer_nll"], 4), "nll": round(float(np.mean(sc["nll"])), 6),
                      "seconds": round(time.time() - t0, 3)})
    was_warm = (model_name, label(cfg)) in tally.warm
    tally.warm.add((model_name, label(cfg)))
    return time.time() - t0, was_warm


# ---- write ----------------------------------------------------------------------------------------------
def write(args, plan: Plan, tally: Tally) -> int:
    """The summary lines, the JSON and (with --markdown) the page."""
    result = result_dict(args, plan, tally, partial=False)
    rows, wall = result["results"], result["run"]["wall_s"]
    summary(rows)
    print(f"done: {len(rows)} cells in {wall:.0f}s ({len(tally.skipped)} rounds skipped for the budget)", flush=True)
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    if args.markdown:
        from .retrieval_doc import write as write_page

        write_page([args.json] if args.json else [], args.markdown, results=None if args.json else [result])
    return 0


@functools.lru_cache(maxsize=1)
def _gpu_name() -> str | None:
    try:
        import subprocess

        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m veloxquant.tools.quality.retrieval", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="measure (budgeted) and write the JSON (and, with --markdown, the page)")
    p.add_argument("--model-dir", type=pathlib.Path, default=COMMITTED,
                   help="the trainer's export folder (default: the committed 8-bit retrieval-4m model, "
                        "tools/quality/trained/retrieval_4m in the source checkout)")
    p.add_argument("--corpus", type=pathlib.Path, default=None,
                   help="the trainer's pack-corpus .npz (default: this Python's stdlib, which must be the "
                        "model's corpus for the held-out text to be held out)")
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    p.add_argument("--max-sequences", type=int, default=len(DEPTHS),
                   help="sequences per context at most (needle depths in DEPTHS order)")
    p.add_argument("--budget-seconds", type=float, default=270.0,
                   help="wall-clock budget from the start, setup included; rounds that would not fit are skipped")
    p.add_argument("--reserve-seconds", type=float, default=10.0, help="kept free for writing the results")
    p.add_argument("--tiers", nargs="+", choices=list(TIERS), default=list(TIERS))
    p.add_argument("--chunk", type=int, default=2048, help="prefill bytes per call")
    p.add_argument("--dtype", choices=["float16", "float32"], default=None,
                   help="compute dtype (default float16 on a GPU, float32 on the CPU; caches always see float16)")
    p.add_argument("--mlx-q-native", action=argparse.BooleanOptionalAction, default=None,
                   help="mlx-lm's QuantizedKVCache through mx.quantized_matmul (default: on a GPU)")
    p.add_argument("--device", choices=["default", "cpu"], default="default")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--first-round", type=int, default=0, metavar="K",
                   help="start at round K (another run measured rounds 0..K-1: the page pools their cells)")
    p.add_argument("--json", type=pathlib.Path, default=None)
    p.add_argument("--markdown", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    args.argv = list(argv) if argv is not None else None
    bad = [c for c in args.contexts if c < 64]
    if bad:
        ap.error(f"--contexts: each must be at least 64 bytes, got {bad}")
    if not 0 <= args.first_round < args.max_sequences:
        ap.error(f"--first-round: {args.first_round} is not in [0, --max-sequences {args.max_sequences})")
    if args.max_sequences < 1 or args.budget_seconds <= 0:
        ap.error("--max-sequences and --budget-seconds: must be positive")
    try:
        return run(args)
    except FileNotFoundError as e:   # --model-dir / --corpus: the message names the argument
        print(f"quality_retrieval: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
