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

    python -m veloxquant.tools.quality.retrieval run --model-dir MODEL [--corpus corpus.npz] \\
        --contexts 1024 4096 16384 32768 --budget-seconds 270 --json out.json [--markdown out.md]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import platform
import sys
import time

import numpy as np

from . import retrieval_train as qrt

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
OUTLIER_PAIRS, OUTLIER_SCALE = 4, (8.0, 20.0)   # rotation pairs per KV head, factor range


# ---- sequences ------------------------------------------------------------------------------------------
def passkey_sequence(text: np.ndarray, length: int, rng, depth: float) -> dict:
    """The trainer's passkey sequence (make_sequence's "passkey" task) with the needle at `depth` of the body.

    Returns tokens (int32, `length` bytes), digits, needle_at/needle_len, and score_mask: rows p (predicting
    tokens[p + 1]) whose target is corpus text, i.e. neither the needle line nor the query and answer."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth: expected a fraction in [0, 1], got {depth}")
    answer = qrt._digits(rng)
    line = qrt.PASSKEY_PREFIX + answer + b"\n"
    tail = qrt.PASSKEY_PREFIX + answer
    body_len = length - len(line) - len(tail)
    if body_len < 8:
        raise ValueError(f"length: {length} bytes leaves no room for text around the passkey")
    s = int(rng.integers(length, text.size - body_len - 1))
    body = text[s : s + body_len]
    cut = np.flatnonzero(body[-200:] == 10)   # the query starts a line, as in make_sequence
    if cut.size and body_len > 200:
        body = body[: body_len - 200 + int(cut[-1]) + 1]
    at = int(depth * body.size)
    at = qrt._line_start(body, at, min(body.size, at + 200))
    seq = qrt._insert(body, at, line)
    if seq[-1] != 10:
        seq = np.concatenate([seq, np.frombuffer(b"\n", np.uint8)])
    seq = np.concatenate([seq, np.frombuffer(tail, np.uint8)])
    pad = length - seq.size          # text in front so the query stays last (make_sequence pads the same way)
    seq = np.concatenate([text[s - pad : s], seq]) if pad > 0 else seq
    at += max(pad, 0)
    is_text = np.ones(length, bool)
    is_text[at : at + len(line)] = False
    is_text[length - len(tail) :] = False
    return {"tokens": seq.astype(np.int32), "digits": answer.decode(), "needle_at": at, "needle_len": len(line),
            "depth": depth, "score_mask": is_text[1:].copy()}


def check_passkey_format(seq: np.ndarray) -> str:
    """The digits of a passkey sequence in the trainer's format; ValueError saying what is wrong otherwise."""
    b = bytes(np.asarray(seq, np.uint8))
    p, n = qrt.PASSKEY_PREFIX, qrt.DIGITS
    tail = b[-(len(p) + n) :]
    if not tail.startswith(p) or not tail[len(p) :].isdigit():
        raise ValueError(f"seq: does not end in {p!r} and {n} digits: {tail!r}")
    if b[-(len(p) + n) - 1 : -(len(p) + n)] != b"\n":
        raise ValueError("seq: the query does not start a line")
    needle = tail + b"\n"
    if b[: -len(tail)].count(needle) != 1:
        raise ValueError(f"seq: the needle line {needle!r} occurs {b[: -len(tail)].count(needle)} times")
    return tail[len(p) :].decode()


# ---- model ----------------------------------------------------------------------------------------------
def load_model(model_dir: pathlib.Path, dtype):
    """The exported folder (config.json + model-NN.safetensors) or a training run folder (state.json with
    model.safetensors or checkpoint.safetensors) as an mlx-lm llama (the trainer's load_run), in `dtype`."""
    exported = (model_dir / "config.json").is_file() and sorted(model_dir.glob("model-*.safetensors"))
    trained = (model_dir / "state.json").is_file() and any(
        (model_dir / f).is_file() for f in ("model.safetensors", "checkpoint.safetensors"))
    if not (exported or trained):
        raise FileNotFoundError(f"--model-dir: {model_dir} holds neither config.json with model-NN.safetensors "
                                "(`retrieval_train export`) nor a training run (state.json and weights)")
    model, cfg = qrt.load_run(model_dir)
    model.set_dtype(dtype)
    return model, cfg


def inject_outliers(model, seed: int, pairs: int = OUTLIER_PAIRS, scale=OUTLIER_SCALE) -> list[dict]:
    """Scale `pairs` RoPE channel pairs of every KV head's keys by a fixed random factor in `scale`, in place,
    and the same channels of the queries that read that head by its inverse.

    RoPE rotates each pair (i, i + d/2; (2i, 2i + 1) when traditional) as a 2-D vector, so scaling both
    channels of a pair commutes with it; q.k is unchanged, so the fp16 model computes the same function and
    only the caches see the outliers. Returns the choice per layer."""
    import mlx.core as mx

    rng = np.random.default_rng(seed)
    out = []
    for li, layer in enumerate(model.layers):
        at = layer.self_attn
        d, hk, hq = at.head_dim, at.n_kv_heads, at.n_heads
        traditional = bool(getattr(at.rope, "traditional", False))
        ks = np.ones(hk * d, np.float32)
        chosen = []
        for h in range(hk):
            for i in rng.choice(d // 2, pairs, replace=False):
                f = float(rng.uniform(*scale))
                ch = (2 * i, 2 * i + 1) if traditional else (i, i + d // 2)
                ks[[h * d + c for c in ch]] = f
                chosen.append([h, int(i), round(f, 3)])
        qs = np.concatenate([1.0 / ks[(h * hk // hq) * d : (h * hk // hq + 1) * d] for h in range(hq)])
        for proj, s in ((at.k_proj, ks), (at.q_proj, qs)):
            w = proj.weight
            proj.weight = (w.astype(mx.float32) * mx.array(s)[:, None]).astype(w.dtype)
            if "bias" in proj:
                proj.bias = (proj.bias.astype(mx.float32) * mx.array(s)).astype(proj.bias.dtype)
        out.append({"layer": li, "head_channel_factor": chosen})
    mx.eval(model.parameters())
    return out


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


# ---- measurement ----------------------------------------------------------------------------------------
def forward(model, caches, tokens: np.ndarray, chunk: int) -> np.ndarray:
    """Logits (len - 1, vocab) float32: prefill in chunks up to the answer, then one byte per call."""
    from .trained_eval import run_sequence

    return run_sequence(model, caches, tokens, qrt.DIGITS, chunk)


def log_softmax(a: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    m = a.max(axis=-1, keepdims=True)
    return a - m - np.log(np.exp(a - m).sum(axis=-1, keepdims=True))


def score(logits: np.ndarray, seq: dict, ref: dict | None) -> dict:
    """NLL over text rows, exact match of the answer, KL against the reference's log-probs (rows scored)."""
    toks = seq["tokens"]
    n, a = toks.size - 1, qrt.DIGITS
    rows = np.flatnonzero(seq["score_mask"])
    ans = np.arange(n - a, n)     # the rows predicting the digits (the first from the query's last byte)
    lp_t, lp_a = log_softmax(logits[rows]), log_softmax(logits[ans])
    nll = -lp_t[np.arange(rows.size), toks[rows + 1]]
    ans_nll = -lp_a[np.arange(a), toks[ans + 1]]
    out = {"nll": nll, "hit": bool(np.all(lp_a.argmax(-1) == toks[ans + 1])), "answer_nll": float(ans_nll.mean()),
           "lp": (lp_t, lp_a)}
    if ref is not None:
        rt, ra = ref["lp"]
        out["kl"] = np.sum(np.exp(rt) * (rt - lp_t), axis=-1)
        out["kl_answer"] = np.sum(np.exp(ra) * (ra - lp_a), axis=-1)
    return out


def key_table(model, seqs: list[dict]) -> list[dict]:
    """Per layer, over the given sequences' tokens (post-RoPE keys and values as the cache receives them):
    median and max Pearson kurtosis over (KV head, channel) (3 for a Gaussian), the largest channel RMS over
    its head's median channel RMS, the channels above 4x, and the median kurtosis across one token's
    coordinates."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from .caches import Float16KV

    acc = [{"k": [], "v": []} for _ in model.layers]
    for s in seqs:
        caches = [KVCache() for _ in model.layers]
        mx.eval(model(mx.array(s["tokens"][None]), cache=[Float16KV(c) for c in caches]))
        for li, c in enumerate(caches):
            for role, arr in zip("kv", c.state[:2]):
                acc[li][role].append(np.array(arr[0, :, : c.offset].astype(mx.float32), dtype=np.float64))
    out = []
    for li, roles in enumerate(acc):
        row = {"layer": li}
        for role, parts in roles.items():
            x = np.concatenate(parts, axis=1)                       # (H, tokens, d)
            mu = x.mean(axis=1, keepdims=True)
            var = ((x - mu) ** 2).mean(axis=1)
            kurt = ((x - mu) ** 4).mean(axis=1) / np.maximum(var, 1e-30) ** 2
            rms = np.sqrt((x**2).mean(axis=1))
            ratio = rms / np.maximum(np.median(rms, axis=1, keepdims=True), 1e-30)
            # across the coordinates of each token's vector: what a rotation spreads (a channel's own
            # kurtosis does not change when the channel is scaled)
            mt = x.mean(axis=2, keepdims=True)
            vt = ((x - mt) ** 2).mean(axis=2)
            kt = ((x - mt) ** 4).mean(axis=2) / np.maximum(vt, 1e-30) ** 2
            row[role] = {"kurtosis_median": float(np.median(kurt)), "kurtosis_max": float(kurt.max()),
                         "rms_ratio_max": float(ratio.max()), "outlier_channels": int((ratio > 4).sum()),
                         "token_kurtosis_median": float(np.median(kt)),
                         "channels": int(ratio.size)}
        out.append(row)
    return out


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


def result_dict(args, t_start, setup_s, device, dtype, mlx_q_native, tiers, outlier_info, cfg_json, corpus,
                corpus_match, stats, skipped, cells, partial: bool, errors=()) -> dict:
    """The JSON: run (where, when, versions), settings, model, corpus, key statistics and one row per cell."""
    from .. import _env

    rows = []
    for (model_name, lab, ctx), c in cells.items():
        nll = np.concatenate(c["nll"])
        kl = np.concatenate(c["kl"]) if c["kl"] else np.zeros(1)
        kla = np.concatenate(c["kl_answer"]) if c["kl_answer"] else np.zeros(1)
        cfg = c["cfg"]
        rows.append({"model": model_name, "label": lab, "method": cfg["method"], "bits": cfg["bits"],
                     "bits2": cfg["bits2"], "variant": cfg["variant"], "window": cfg["window"], "context": ctx,
                     "sequences": len(c["seqs"]), "retrieval": float(np.mean([s["hit"] for s in c["seqs"]])),
                     "hits": int(sum(s["hit"] for s in c["seqs"])), "nll": float(nll.mean()),
                     "ppl": float(np.exp(nll.mean())), "kl_mean": float(kl.mean()),
                     "kl_p99": float(np.percentile(kl, 99)), "kl_answer_mean": float(kla.mean()),
                     "bits_per_coord": float(np.mean([b[0] for b in c["bits"]])),
                     "role_bits_per_coord": float(np.mean([b[1] for b in c["bits"]])), "per_sequence": c["seqs"]})
    wall = time.time() - t_start
    result = {
        "tool": "python -m veloxquant.tools.quality.retrieval run",
        "command": " ".join(["python -m veloxquant.tools.quality.retrieval", *(args.argv or sys.argv[1:])]),
        "run": {"date": _env.utc_now_iso(), "device": device, "host": platform.node(),
                "gpu": os.environ.get("VELOXQUANT_GPU_NAME") or _gpu_name(), "versions": _env.versions(),
                "wall_s": round(wall, 1), "partial": partial, "setup_s": round(setup_s, 1), "budget_s": args.budget_seconds},
        "settings": {"contexts": args.contexts, "max_sequences": args.max_sequences, "chunk": args.chunk,
                     "seed": args.seed, "dtype": str(dtype), "mlx_q_native": mlx_q_native, "tiers": tiers,
                     "tier_defs": {t: {"model": m, "variants": list(v), "share": s} for t, (m, v, s) in TIERS.items()},
                     "grid": [list(g) for g in GRID], "window": WINDOW, "depths": list(DEPTHS),
                     "kivi_group_size": 32, "mlx_affine_group_size": 32, "cache_attention": "dequantize",
                     "outliers": {"pairs_per_kv_head": OUTLIER_PAIRS, "scale": list(OUTLIER_SCALE),
                                  "layers": outlier_info}},
        "model": {"dir": str(args.model_dir), **{k: cfg_json.get(k) for k in
                                                  ("preset", "step", "total", "parameters", "model_args", "seed",
                                                   "commands", "corpus")}},
        "corpus": {**corpus["manifest"], "matches_model": corpus_match},
        "key_statistics": stats, "skipped_rounds": skipped, "errors": list(errors),
        "results": rows,
    }
    return result


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
    import mlx.core as mx

    t_start = time.time()
    if args.device == "cpu":
        mx.set_default_device(mx.cpu)
    device = str(mx.default_device())
    on_gpu = "gpu" in device
    dtype = {"float16": mx.float16, "float32": mx.float32}[args.dtype or ("float16" if on_gpu else "float32")]
    mlx_q_native = on_gpu if args.mlx_q_native is None else args.mlx_q_native
    models = {}
    base, cfg_json = load_model(args.model_dir, dtype)
    corpus = qrt.load_corpus(args.corpus)
    text = corpus["heldout"]
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
    # the sequences: one per (context, round), the same for every configuration and model variant
    seqs = {}
    for ci, ctx in enumerate(args.contexts):
        for r in range(args.max_sequences):
            rng = np.random.default_rng([args.seed, ctx, r])
            seqs[(ctx, r)] = passkey_sequence(text, ctx, rng, DEPTHS[r % len(DEPTHS)])
    stat_ctx = min(args.contexts + [2048])
    stat_seqs = [passkey_sequence(text, stat_ctx, np.random.default_rng([args.seed, 1, i]), 0.5) for i in range(2)]
    stats = {name: key_table(m, stat_seqs) for name, m in models.items()}
    setup_s = time.time() - t_start
    print(f"quality-retrieval: {cfg_json.get('preset')} ({cfg_json.get('parameters', 0):,} parameters, step "
          f"{cfg_json.get('step')}/{cfg_json.get('total')}), {device}, {dtype}, contexts {args.contexts}, budget "
          f"{args.budget_seconds:.0f}s, tiers {tiers}; setup {setup_s:.1f}s", flush=True)

    cells: dict[tuple, dict] = {}      # (model, label, ctx) -> accumulators
    refs: dict[tuple, dict] = {}       # (model, ctx, round) -> fp16 score
    budget = Budget()
    per_config: dict[int, float] = {}  # ctx -> seconds per configuration per sequence (warm runs, any tier)
    warm: set[tuple[str, str]] = set()  # (model, label) run before: its kernels are compiled, its time is typical
    skipped, errors = [], []
    deadline = t_start + args.budget_seconds
    pool = max(0.0, args.budget_seconds - setup_s - args.reserve_seconds)
    carry = 0.0

    def do_config(model_name, cfg, ctx, r):
        seq = seqs[(ctx, r)]
        key = (model_name, ctx, r)
        t0 = time.time()
        caches = make_caches(models[model_name], cfg, args.seed, mlx_q_native)
        sc = score(forward(models[model_name], caches, seq["tokens"], args.chunk), seq,
                   None if cfg["method"] == "fp16" else refs[key])
        if cfg["method"] == "fp16":
            refs[key] = sc
        from .caches import cache_bits

        at = models[model_name].layers[0].self_attn
        bits = cache_bits(caches, at.n_kv_heads * at.head_dim, seq["tokens"].size - 1)
        c = cells.setdefault((model_name, label(cfg), ctx), {"cfg": cfg, "nll": [], "kl": [], "kl_answer": [],
                                                              "seqs": [], "bits": []})
        c["nll"].append(sc["nll"])
        if "kl" in sc:
            c["kl"].append(sc["kl"])
            c["kl_answer"].append(sc["kl_answer"])
        c["bits"].append(bits)
        c["seqs"].append({"round": r, "depth": seq["depth"], "needle_at": seq["needle_at"], "hit": sc["hit"],
                          "answer_nll": round(sc["answer_nll"], 4), "seconds": round(time.time() - t0, 3)})
        was_warm = (model_name, label(cfg)) in warm
        warm.add((model_name, label(cfg)))
        return time.time() - t0, was_warm

    for tier in tiers:
        model_name, variants, share = TIERS[tier]
        tier_cfgs = configs(variants)
        if tier == "roles":
            tier_cfgs = [c for c in tier_cfgs if c["method"] not in BASELINES]
        tier_budget = pool * share / sum(TIERS[t][2] for t in tiers) + carry
        tier_t0 = time.time()
        for r in range(args.max_sequences):
            for ctx in args.contexts:
                need_ref = (model_name, ctx, r) not in refs
                n = len(tier_cfgs) + (1 if need_ref and tier_cfgs[0]["method"] != "fp16" else 0)
                est = budget.estimate(tier, ctx, n, per_config)
                used = time.time() - tier_t0
                late = time.time() >= deadline - args.reserve_seconds
                # the first tier's first sequence at every context may use the whole budget: every context
                # gets its fp16 / q8 / q4 / kv cells before anything else is measured
                cap = float("inf") if (tier == tiers[0] and r == 0) else tier_budget
                if late or (est is not None and (used + est > cap
                                                 or time.time() + est > deadline - args.reserve_seconds)):
                    skipped.append({"tier": tier, "context": ctx, "round": r,
                                    "estimate_s": None if est is None else round(est, 1)})
                    continue
                t_round, all_warm = time.time(), True
                todo = ([configs(())[0]] if need_ref and tier_cfgs[0]["method"] != "fp16" else []) + tier_cfgs
                ran = 0
                for k, cfg in enumerate(todo):
                    if k and time.time() + per_config.get(ctx, 0.0) > deadline - args.reserve_seconds:
                        skipped.append({"tier": tier, "context": ctx, "round": r, "cut_after_configs": k})
                        break     # the hard deadline: the round stops part way (cells count their sequences)
                    try:
                        dt, was_warm = do_config(model_name, cfg, ctx, r)
                    except Exception as e:   # one failing cache must not cost the rest of the run: say it, go on
                        if cfg["method"] == "fp16":
                            raise
                        errors.append({"model": model_name, "label": label(cfg), "context": ctx, "round": r,
                                       "error": f"{type(e).__name__}: {e}"[:500]})
                        print(f"error: {model_name} {label(cfg)} ctx {ctx}: {errors[-1]['error']}", flush=True)
                        continue
                    all_warm &= was_warm
                    ran += 1
                    if was_warm:   # a first run compiles kernels: its time says nothing about the next ones
                        per_config[ctx] = dt if ctx not in per_config else 0.5 * (per_config[ctx] + dt)
                dt = time.time() - t_round
                if all_warm:
                    budget.seen[(tier, ctx)] = max(dt, budget.seen.get((tier, ctx), 0.0))
                if args.json:   # after every round, so a run stopped from outside still leaves its cells
                    write_json(args.json, result_dict(args, t_start, setup_s, device, dtype, mlx_q_native, tiers,
                                                      outlier_info, cfg_json, corpus, corpus_match, stats, skipped,
                                                      cells, partial=True, errors=errors))
                fp = cells[(model_name, "fp16", ctx)]["seqs"]
                print(f"[{time.time() - t_start:6.1f}s] {tier:<8} ctx {ctx:>6} round {r} depth {DEPTHS[r % len(DEPTHS)]:.1f}: "
                      f"{ran}/{len(todo)} configs in {dt:.1f}s; fp16 retrieval so far {sum(s['hit'] for s in fp)}/{len(fp)}",
                      flush=True)
        carry = max(0.0, tier_budget - (time.time() - tier_t0))

    result = result_dict(args, t_start, setup_s, device, dtype, mlx_q_native, tiers, outlier_info, cfg_json,
                         corpus, corpus_match, stats, skipped, cells, partial=False, errors=errors)
    rows, wall = result["results"], result["run"]["wall_s"]
    summary(rows)
    print(f"done: {len(rows)} cells in {wall:.0f}s ({len(skipped)} rounds skipped for the budget)", flush=True)
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    if args.markdown:
        from .retrieval_doc import write

        write([args.json] if args.json else [], args.markdown, results=None if args.json else [result])
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
    p.add_argument("--model-dir", type=pathlib.Path, required=True, help="the trainer's export folder")
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
    p.add_argument("--json", type=pathlib.Path, default=None)
    p.add_argument("--markdown", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    args.argv = list(argv) if argv is not None else None
    bad = [c for c in args.contexts if c < 64]
    if bad:
        ap.error(f"--contexts: each must be at least 64 bytes, got {bad}")
    if args.max_sequences < 1 or args.budget_seconds <= 0:
        ap.error("--max-sequences and --budget-seconds: must be positive")
    try:
        return run(args)
    except FileNotFoundError as e:   # --model-dir / --corpus: the message names the argument
        print(f"quality_retrieval: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
