"""`veloxquant quality --model trained`: perplexity, passkey retrieval and KL on the trained byte-level
llama (tools/quality/trained_model.py), every cache against mlx-lm's fp16 KVCache and its QuantizedKVCache.

One evaluation sequence = held-out stdlib text of `context` bytes with a line `PASSKEY = 12345` spliced in
at a random line start (depth 10-80 %), ending in the query `PASSKEY = ` and the 5 answer digits. Each
cache reads it the way generate_step would: the text and the query in chunks of `--chunk` bytes (prefill),
then the answer one byte per call (decode), teacher-forced. From the logits at every position:
- perplexity: exp(mean next-byte NLL) over the text positions (not the passkey line, query or answer);
- KL(p_fp16 || p_cache) over the same positions, mean and 99th percentile, float64;
- retrieval: exact match of the 5 digits; teacher-forced argmax at each digit is exactly greedy decoding
  (greedy emits the answer iff every argmax given the correct prefix is correct).
Configurations: every method and bit width (spec/formats.toml, restricted to <= 4 stored bits per
coordinate; turboquant_rvq as bits+bits2) on keys and values, keys only, values only, with the first and
last layer in fp16, and with a window; mlx-lm's KVCache (the reference) and QuantizedKVCache q4 / q8.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import time
import types

import numpy as np

from . import trained_model as tm
from .trained_doc import BASELINES, write_docs

# (method, bits, bits2) of the grid: stored code bits per coordinate 1..4 (turboquant_prod's bits count
# its QJL bit; turboquant_rvq's are bits + bits2).
GRID = ([("turboquant", b, None) for b in (1, 2, 3, 4)]
        + [("turboquant_rvq", b, b2) for b, b2 in ((1, 1), (2, 1), (2, 2), (3, 1))]
        + [("turboquant_prod", b, None) for b in (2, 3, 4)]
        + [("kivi", b, None) for b in (1, 2, 3, 4)]
        + [("rabitq", 1, None)]
        + [("mlx_affine", b, None) for b in (2, 4)])
VARIANTS = {  # name: (roles quantized, fp16_layers, window)
    "kv": ("kv", (0, 0), 0),
    "k": ("k", (0, 0), 0),
    "v": ("v", (0, 0), 0),
    "kv+fp16ends": ("kv", (1, 1), 0),
    "kv+window": ("kv", (0, 0), 128),
}

# Presets: (head_dim, context, sequences, variants, grid) blocks. `full` is the documented run; `quick` is
# CI's (one method, one bit width, short context).
PRESETS = {
    "full": [(64, 1024, 8, tuple(VARIANTS), GRID), (128, 1024, 8, ("kv",), GRID),
             (64, 4096, 2, ("kv",), GRID)],
    "quick": [(64, 256, 2, ("kv",), [("turboquant", 4, None)])],
}


from .caches import (AFFINE_GROUP, KIVI_GROUP, DequantizedQuantizedKVCache,  # noqa: E402,F401
                             Float16KV, OneRoleCache, _make_caches, cache_bits, make_caches)


def eval_sequences(context: int, count: int, seed: int) -> list[dict]:
    """Held-out passkey sequences of exactly `context` bytes: text with the passkey line at a line start,
    the query line prefix and the digits. Masks mark text positions (targets scored for NLL/KL)."""
    text = tm.corpus_bytes("heldout")
    rng = np.random.default_rng(seed)
    out = []
    span = (text.size - 2 * context) // count
    for i in range(count):
        digits = "".join(rng.choice(list("0123456789"), tm.PASSKEY_DIGITS))
        line = np.frombuffer(tm.passkey_line(digits), np.uint8)
        query = np.frombuffer(tm.PASSKEY_PREFIX, np.uint8)
        answer = np.frombuffer(digits.encode(), np.uint8)
        n_text = context - line.size - query.size - answer.size
        # n_text bytes of held-out text ending in a newline, so the query starts a line
        start = i * span + int(rng.integers(0, span))
        end = start + n_text - 1 + int(np.flatnonzero(text[start + n_text - 1 :] == 10)[0])
        body = text[end - n_text + 1 : end + 1]
        depth = int(rng.uniform(0.1, 0.8) * n_text)
        at = min(tm._line_start(body, depth), n_text - 1)
        seq = np.concatenate([body[:at], line, body[at:], query, answer]).astype(np.int32)
        # target at position p is seq[p + 1]; text targets are the body's bytes after the first one
        is_text = np.zeros(context, bool)
        is_text[:at] = True
        is_text[at + line.size : at + line.size + (n_text - at)] = True
        target_text = np.zeros(context - 1, bool)
        target_text[:] = is_text[1:]
        target_text[at - 1 : at + line.size] = False  # predicting the passkey line (incl. its first byte)
        out.append({"tokens": seq, "answer_len": answer.size, "digits": digits, "needle_at": at,
                    "score_mask": target_text})
    return out


# ---- measurement ----------------------------------------------------------------------------------
def run_sequence(model, caches, tokens: np.ndarray, answer_len: int, chunk: int):
    """float32 logits for every position: prefill in chunks up to the answer, then one byte per call."""
    import mlx.core as mx

    x = mx.array(tokens[None])
    n_prefill = tokens.size - answer_len
    out = []
    for s in range(0, n_prefill, chunk):
        e = min(s + chunk, n_prefill)
        out.append(model(x[:, s:e], cache=caches)[0].astype(mx.float32))
        mx.eval(out[-1])
    for p in range(n_prefill, tokens.size - 1):   # the last answer byte is a target only
        out.append(model(x[:, p : p + 1], cache=caches)[0].astype(mx.float32))
        mx.eval(out[-1])
    return np.array(mx.concatenate(out, axis=0))     # (len - 1, vocab): row p predicts tokens[p + 1]


def log_softmax(a: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    m = a.max(axis=-1, keepdims=True)
    return a - m - np.log(np.exp(a - m).sum(axis=-1, keepdims=True))


def score(logits: np.ndarray, seq: dict, ref_logp: np.ndarray | None):
    """NLL on text targets, exact match of the answer, KL vs the reference log-probs (if given)."""
    toks = seq["tokens"]
    lp = log_softmax(logits)
    n = toks.size - 1
    tgt = toks[1:]
    nll = -lp[np.arange(n), tgt]
    mask = seq["score_mask"]
    a = seq["answer_len"]
    # rows n - a .. n - 1 predict the answer digits (the first one from the query's last byte)
    digit_ok = lp[n - a : n].argmax(-1) == tgt[n - a : n]
    correct = bool(np.all(digit_ok))
    kl = None
    if ref_logp is not None:
        kl = np.sum(np.exp(ref_logp) * (ref_logp - lp), axis=-1)[mask]
    return nll[mask], correct, kl, lp, {"answer_nll": float(nll[n - a :].mean()),
                                        "digit_acc": float(digit_ok.mean())}


def config_label(cfg: dict) -> str:
    if cfg["method"] in BASELINES:
        return cfg["method"]
    b = f"{cfg['bits']}+{cfg['bits2']}" if cfg["bits2"] else str(cfg["bits"])
    return f"{cfg['method']}/{b}/{cfg['variant']}"


def configs_for(variants, grid) -> list[dict]:
    out = [{"method": "fp16", "bits": 16, "bits2": None, "variant": "fp16", "roles": "none",
            "fp16_layers": (0, 0), "window": 0},
           {"method": "mlx_q8", "bits": 8, "bits2": None, "variant": "kv", "roles": "kv",
            "fp16_layers": (0, 0), "window": 0},
           {"method": "mlx_q4", "bits": 4, "bits2": None, "variant": "kv", "roles": "kv",
            "fp16_layers": (0, 0), "window": 0}]
    for v in variants:
        roles, ends, window = VARIANTS[v]
        for m, b, b2 in grid:
            out.append({"method": m, "bits": b, "bits2": b2, "variant": v, "roles": roles,
                        "fp16_layers": ends, "window": window})
    return out


def key_statistics(model, seqs: list[dict]) -> dict:
    """Per-channel statistics of the keys (and values) the cache receives (post-RoPE, float16), over the
    tokens of the given sequences: Pearson kurtosis per (layer, head, channel) (3 for a Gaussian) and
    outlier channels (RMS above 4x the median channel RMS of their head)."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    acc = {"k": [], "v": []}
    for s in seqs:
        caches = [KVCache() for _ in model.layers]
        mx.eval(model(mx.array(s["tokens"][None]), cache=[Float16KV(c) for c in caches]))
        for layer, c in enumerate(caches):
            k, v = (a[..., : c.offset, :] for a in c.state[:2])   # buffers grow in steps past offset
            acc["k"].append((layer, np.array(k[0].astype(mx.float32), dtype=np.float64)))
            acc["v"].append((layer, np.array(v[0].astype(mx.float32), dtype=np.float64)))
    out = {}
    for role, items in acc.items():
        layers = sorted({layer for layer, _ in items})
        kurt, ratio = [], []
        for layer in layers:
            x = np.concatenate([a for l, a in items if l == layer], axis=1)   # (H, tokens, d)
            mu = x.mean(axis=1, keepdims=True)
            var = ((x - mu) ** 2).mean(axis=1)
            kurt.append(((x - mu) ** 4).mean(axis=1) / np.maximum(var, 1e-30) ** 2)
            rms = np.sqrt((x**2).mean(axis=1))                                  # (H, d)
            ratio.append(rms / np.median(rms, axis=1, keepdims=True))
        kurt, ratio = np.stack(kurt), np.stack(ratio)                           # (L, H, d)
        out[role] = {"kurtosis_median": float(np.median(kurt)), "kurtosis_p99": float(np.percentile(kurt, 99)),
                     "kurtosis_max": float(kurt.max()), "rms_ratio_max": float(ratio.max()),
                     "outlier_channels": int((ratio > 4).sum()), "channels": int(ratio.size)}
    return out


def run_block(model, head_dim: int, context: int, count: int, configs: list[dict], args, progress) -> list[dict]:
    """Rows for `configs` on one block's sequences; the fp16 reference runs first whether or not it is
    one of them (its log-probs are what KL is measured against)."""
    seqs = eval_sequences(context, count, args.seed)
    ref = configs_for((), [])[0]
    todo = configs if configs and configs[0]["method"] == "fp16" else [ref, *configs]
    rows, ref_lps = [], []
    for cfg in todo:
        t0 = time.time()
        nlls, hits, kls, bits, answers = [], [], [], [], []
        for i, s in enumerate(seqs):
            caches = make_caches(model, cfg, args.seed, args.mlx_q_native)
            logits = run_sequence(model, caches, s["tokens"], s["answer_len"], args.chunk)
            is_ref = cfg["method"] == "fp16"   # the first configuration: its log-probs are the reference
            nll, hit, kl, lp, ans = score(logits, s, None if is_ref else ref_lps[i])
            answers.append(ans)
            if is_ref:
                ref_lps.append(lp)
            nlls.append(nll)
            hits.append(hit)
            if kl is not None:
                kls.append(kl)
            bits.append(cache_bits(caches, tm.KV_WIDTH, s["tokens"].size - 1))
        nll = np.concatenate(nlls)
        kl = np.concatenate(kls) if kls else np.zeros(1)
        row = {**cfg, "fp16_layers": list(cfg["fp16_layers"]), "label": config_label(cfg), "head_dim": head_dim,
               "context": context, "sequences": len(seqs), "nll": float(nll.mean()), "ppl": float(np.exp(nll.mean())),
               "retrieval": float(np.mean(hits)), "answer_nll": float(np.mean([x["answer_nll"] for x in answers])),
               "digit_acc": float(np.mean([x["digit_acc"] for x in answers])), "kl_mean": float(kl.mean()),
               "kl_p99": float(np.percentile(kl, 99)), "bits_per_coord": float(np.mean([b[0] for b in bits])),
               "role_bits_per_coord": float(np.mean([b[1] for b in bits])), "seconds": round(time.time() - t0, 2)}
        if cfg is ref and todo is not configs:
            continue   # computed for the reference only
        rows.append(row)
        progress(row)
    return rows


def run(args) -> int:
    import mlx.core as mx

    ok, why = tm.corpus_status()
    if not ok:
        print(f"veloxquant quality --model trained: {why}; the committed model and its held-out text come "
              "from that corpus, so the numbers would not be comparable", file=sys.stderr)
        return 2
    blocks = [b for b in PRESETS[args.sweep] if b[0] in args.head_dims]
    if args.methods_given or args.bits is not None:
        blocks = [(d, n, c, v, [g for g in grid if g[0] in args.methods and (args.bits is None or g[1] in args.bits)])
                  for d, n, c, v, grid in blocks]
    if args.sequences_given:
        blocks = [(d, n, args.sequences, v, g) for d, n, _, v, g in blocks]
    if args.contexts:  # every block at each given context (duplicates dropped)
        blocks = list(dict.fromkeys((d, n, c, v, tuple(g)) for d, _, c, v, g in blocks for n in args.contexts))
    total = sum(3 + len(v) * len(g) for _, _, _, v, g in blocks)
    print(f"veloxquant quality --model trained: sweep {args.sweep}, {total} configurations in {len(blocks)} "
          f"block(s), chunk {args.chunk}", flush=True)
    t0, done, rows, stats, load0 = time.time(), [0], [], {}, os.getloadavg()[0]

    def progress(r):
        done[0] += 1
        print(f"[{done[0]}/{total} {time.time() - t0:6.0f}s] hd{r['head_dim']} ctx{r['context']} "
              f"{r['label']:<32} bits/coord {r['role_bits_per_coord']:6.2f}  ppl {r['ppl']:7.4f}  "
              f"KL {r['kl_mean']:.2e}/{r['kl_p99']:.2e}  retrieval {r['retrieval']:.0%} (answer NLL "
              f"{r['answer_nll']:.2f})  ({r['seconds']:.0f}s)",
              flush=True)

    for d in dict.fromkeys(b[0] for b in blocks):
        stat_seqs = eval_sequences(1024, 2, args.seed + 1)
        stats[d] = {"trained": key_statistics(tm.load_model(d, dtype=mx.float32), stat_seqs),
                    "random": key_statistics(_random_fp16(d, args.seed, mx.float32), stat_seqs)}
    settings = types.SimpleNamespace(seed=args.seed, chunk=args.chunk, mlx_q_native=args.mlx_q_native)
    plain_blocks = [(d, n, c, tuple(v), [tuple(x) for x in g]) for d, n, c, v, g in blocks]
    jobs = max(1, args.jobs)
    if jobs == 1:
        parts = [_shard((0, 1, plain_blocks, settings, t0), progress)]
    else:  # separate processes: MLX's CPU ops on these small tensors use about one core each
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            parts = pool.map(_shard, [(i, jobs, plain_blocks, settings, t0) for i in range(jobs)])
    rows = [r for _, r in sorted((x for part in parts for x in part), key=lambda x: x[0])]
    wall = time.time() - t0
    rec = _env().run_record("veloxquant", device=str(mx.default_device()))
    rec["command"] = getattr(args, "command_line", None) or rec["command"]   # as `python -m` ran it
    result = {
        "tool": "veloxquant quality --model trained", **rec,
        "wall_s": round(wall, 1),
        # The machine's share matters for wall time: BLAS preloaded (see DEVELOPERS.md) and load averages.
        "ld_preload": os.environ.get("LD_PRELOAD"), "loadavg_start": load0, "loadavg_end": os.getloadavg()[0],
        "settings": {"sweep": args.sweep, "jobs": jobs, "chunk": args.chunk, "seed": args.seed, "kivi_group_size": KIVI_GROUP,
                     "mlx_affine_group_size": AFFINE_GROUP, "mlx_q_group_size": 64,
                     "compute": "float16 weights, float32 activations; caches see and store float16",
                     "mlx_q_attention": "mx.quantized_matmul (native)" if args.mlx_q_native else
                     "dequantized, float attention",
                     "blocks": [{"head_dim": d, "context": n, "sequences": c, "variants": list(v),
                                 "grid": [list(x) for x in g]} for d, n, c, v, g in blocks],
                     "variants": {k: {"roles": r, "fp16_layers": list(e), "window": w}
                                  for k, (r, e, w) in VARIANTS.items()}},
        "models": {str(d): {k: tm.load_record(d)[k] for k in ("parameters", "heldout_loss", "train_wall_s",
                                                                "corpus_sha256", "phases", "command")}
                   for d in stats},
        "key_statistics": {str(d): s for d, s in stats.items()},
        "results": rows,
    }
    print(f"done: {len(rows)} configurations in {wall:.0f}s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.markdown:
        write_docs(result, args.json, args.markdown)
    if not args.json and not args.markdown:
        print("nothing written (give --json and/or --markdown)")
    return 0


def _shard(task, progress=None) -> list[tuple[tuple[int, int], dict]]:
    """Configurations j with j % jobs == shard of every block, as ((block, j), row)."""
    import mlx.core as mx

    shard, jobs, blocks, settings, t0 = task
    out, models = [], {}

    def say(r):
        print(f"[shard {shard + 1}/{jobs} {time.time() - t0:6.0f}s] hd{r['head_dim']} ctx{r['context']} "
              f"{r['label']:<32} bits/coord {r['role_bits_per_coord']:6.2f}  ppl {r['ppl']:7.4f}  "
              f"KL {r['kl_mean']:.2e}/{r['kl_p99']:.2e}  retrieval {r['retrieval']:.0%} (answer NLL "
              f"{r['answer_nll']:.2f})  ({r['seconds']:.0f}s)", flush=True)

    for b, (d, n, c, v, g) in enumerate(blocks):
        configs = configs_for(v, g)
        mine = [j for j in range(len(configs)) if j % jobs == shard]
        if not mine:
            continue
        if d not in models:
            models[d] = tm.load_model(d, dtype=mx.float32)   # float16 weights; see Float16KV
        rows = run_block(models[d], d, n, c, [configs[j] for j in mine], settings, progress or say)
        out += [((b, j), r) for j, r in zip(mine, rows)]
    return out


def _random_fp16(head_dim: int, seed: int, dtype=None):
    import mlx.core as mx

    dtype = dtype or mx.float16
    model = tm.new_model(head_dim, seed)
    model.set_dtype(mx.float16)
    model.set_dtype(dtype)   # float16 values; float32 compute if asked (see Float16KV)
    mx.eval(model.parameters())
    return model


def _env():
    from .. import _env

    return _env
