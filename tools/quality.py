"""`veloxquant quality`: KL divergence of next-token distributions, compressed cache vs the fp16 KVCache.

For each method, bits and head dim: a small randomly initialised mlx-lm llama (2 layers, float16, fixed
seed) reads the same token sequences twice, once with mlx-lm's KVCache and once with the method's cache
(accelerated.cache.make_prompt_cache), teacher-forced (prefill, then one token per step, the same tokens for
both). At every position after the prefill we compute KL(p_fp16 || p_method) in float64 and whether the
argmax agrees. Random models are not trained models: the numbers rank methods and bit widths against each
other on the same model; they do not predict perplexity on real text.

With --json, writes the JSON (versions, device, date, command, settings, one row per configuration); with
--markdown too, the table and, with matplotlib, a .png next to it (KL vs bits/coord); without either flag it
only prints (the tracked docs: --json docs/quality.json --markdown docs/quality.md). --from-json
re-renders the markdown and the figure from an earlier JSON without measuring. Methods cover spec/methods/; bits are each method's allowed set
(spec/formats.toml) unless --bits narrows it.
"""
from __future__ import annotations

import json
import pathlib
import sys
import time

import numpy as np

from veloxquant import spec

from ._env import utc_now_iso, versions

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_METHODS = ("turboquant", "turboquant_rvq", "turboquant_prod", "kivi", "rabitq")
VOCAB = 512


def add_arguments(p) -> None:
    p.add_argument("--model", choices=["random", "trained"], default="random",
                   help="random: KL on random-weight models (this module); trained: perplexity, passkey "
                        "retrieval and KL on the committed trained byte-level model (tools/quality_trained.py)")
    p.add_argument("--sweep", choices=["full", "quick"], default="full",
                   help="--model trained: the documented sweep (full) or CI's (quick: one method, one bits)")
    p.add_argument("--contexts", nargs="+", type=int, default=None,
                   help="--model trained: context lengths in bytes (default: the sweep's)")
    p.add_argument("--chunk", type=int, default=64, help="--model trained: prefill chunk (bytes per call)")
    p.add_argument("--jobs", type=int, default=1,
                   help="--model trained: processes sharing the configurations (the caches' CPU ops use about "
                        "one core each; use the core count)")
    p.add_argument("--mlx-q-native", action="store_true",
                   help="--model trained: attend over mlx-lm's QuantizedKVCache with mx.quantized_matmul "
                        "(its own path; ~10x slower on CPU) instead of over its dequantized arrays")
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=DEFAULT_METHODS + ("mlx_affine",),
                   help="methods to try (random model: mlx_affine is not in the default set)")
    p.add_argument("--bits", nargs="+", type=int, default=None,
                   help="bit widths to try (each method keeps only those it allows); default: all allowed")
    p.add_argument("--head-dims", nargs="+", type=int, default=[64, 128], choices=[64, 128])
    p.add_argument("--prompt", type=int, default=64, help="prefill tokens per sequence")
    p.add_argument("--steps", type=int, default=32, help="decode steps per sequence (KL measured at each)")
    p.add_argument("--sequences", type=int, default=None,
                   help="random token sequences per model (default 2); --model trained: passkey sequences "
                        "per block (default: the sweep's)")
    p.add_argument("--window", type=int, default=0, help="spec window R (exact newest tokens) for all methods")
    p.add_argument("--group-size", type=int, default=32, help="kivi group size")
    p.add_argument("--seed", type=int, default=0, help="model init, token and cache seed")
    p.add_argument("--json", type=pathlib.Path, default=None,
                   help="write the raw results here (default: nothing is written)")
    p.add_argument("--markdown", type=pathlib.Path, default=None,
                   help="write the table here, the figure next to it with suffix .png (needs --json; "
                        "default: nothing is written)")
    p.add_argument("--from-json", type=pathlib.Path, default=None, metavar="JSON",
                   help="measure nothing: re-render --markdown and its figure from this quality JSON")


# ---- model and measurement (also used by tests/test_mlx_lm_integration.py) --------------------------
def tiny_llama(head_dim: int, seed: int = 0, dtype=None, layers: int = 2):
    """A random mlx-lm llama: 4 query heads over 2 KV heads of `head_dim`, hidden 256, vocab 512."""
    import mlx.core as mx
    from mlx_lm.models import llama

    mx.random.seed(seed)
    args = llama.ModelArgs(model_type="llama", hidden_size=256, num_hidden_layers=layers,
                           intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=head_dim, rms_norm_eps=1e-5, vocab_size=VOCAB)
    model = llama.Model(args)
    model.set_dtype(mx.float16 if dtype is None else dtype)
    mx.eval(model.parameters())
    return model


def teacher_forced_logits(model, caches, tokens, prompt: int):
    """float32 logits (len(tokens) - prompt + 1, vocab): after the prefill, then after each next token."""
    import mlx.core as mx

    out = [model(tokens[None, :prompt], cache=caches)[0, -1]]
    for i in range(prompt, tokens.shape[0]):
        out.append(model(tokens[None, i : i + 1], cache=caches)[0, -1])
    return mx.stack(out).astype(mx.float32)


def kl_divergence(ref_logits, logits) -> np.ndarray:
    """KL(softmax(ref) || softmax(logits)) per row, float64."""
    a = np.asarray(ref_logits, dtype=np.float64)
    b = np.asarray(logits, dtype=np.float64)
    la = a - _logsumexp(a)
    lb = b - _logsumexp(b)
    return np.sum(np.exp(la) * (la - lb), axis=-1)


def _logsumexp(x):
    m = x.max(axis=-1, keepdims=True)
    return m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def cache_kwargs(method: str, bits: int, args) -> dict:
    kw = dict(method=method, bits=bits, window=args.window, seed=args.seed)
    if method == "kivi":
        kw["group_size"] = args.group_size
    return kw


def measure(model, token_seqs, prompt: int, ref_logits, kwargs: dict) -> dict:
    """KL / top-1 agreement over all sequences and positions, and stored bits per coordinate."""
    import mlx.core as mx
    from veloxquant.accelerated.cache import make_prompt_cache

    kls, agree, nbytes, coords = [], [], 0, 0
    for toks, ref in zip(token_seqs, ref_logits):
        caches = make_prompt_cache(model, **kwargs)
        logits = teacher_forced_logits(model, caches, toks, prompt)
        kls.append(kl_divergence(np.array(ref), np.array(logits)))
        agree.append(np.array(mx.argmax(ref, axis=-1)) == np.array(mx.argmax(logits, axis=-1)))
        for c in caches:
            nbytes += c.nbytes
            b, h, _, d = c.state[0]["window"].shape
            coords += 2 * b * h * c.offset * d            # keys and values
    kl = np.concatenate(kls)
    return {"kl_mean": float(kl.mean()), "kl_median": float(np.median(kl)), "kl_max": float(kl.max()),
            "top1_agree": float(np.concatenate(agree).mean()), "bits_per_coord": 8.0 * nbytes / coords,
            "positions": int(kl.size)}


# ---- command ---------------------------------------------------------------------------------------
def configurations(args) -> list[tuple[str, int]]:
    out = []
    for m in args.methods:
        allowed = spec.method_info(m)["bits"]
        for b in allowed if args.bits is None else [b for b in args.bits if b in allowed]:
            out.append((m, b))
    return out


def run(args) -> int:
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    if args.model == "trained":
        from . import quality_trained

        args.methods_given = args.methods != list(DEFAULT_METHODS)
        args.sequences_given = args.sequences is not None
        if args.from_json:
            return quality_trained.write_docs(json.loads(args.from_json.read_text()), args.from_json,
                                              args.markdown or args.from_json.with_suffix(".md"))
        return quality_trained.run(args)
    # Nothing is written unless asked (the tracked docs/quality.* are regenerated with
    # --json docs/quality.json --markdown docs/quality.md); the markdown names its raw data, so needs --json.
    args.sequences = 2 if args.sequences is None else args.sequences
    if args.from_json:
        return write_docs(json.loads(args.from_json.read_text()), args.from_json,
                          args.markdown or args.from_json.with_suffix(".md"))
    if args.markdown and not args.json:
        print("quality: --markdown needs --json (the markdown links its raw data)", file=sys.stderr)
        return 2
    configs = configurations(args)
    if not configs:
        print("no (method, bits) configuration selected", file=sys.stderr)
        return 2
    total = len(configs) * len(args.head_dims)
    rows, done, t0 = [], 0, time.time()
    print(f"{'method':<16} {'bits':>4} {'d':>4} {'bits/coord':>10} {'KL mean':>10} {'KL max':>10} "
          f"{'top-1':>6}")
    for d in args.head_dims:
        model = tiny_llama(d, seed=args.seed)
        seqs = [mx.random.randint(0, VOCAB, (args.prompt + args.steps,), key=mx.random.key(args.seed + 1 + i))
                for i in range(args.sequences)]
        refs = [teacher_forced_logits(model, [KVCache() for _ in model.layers], s, args.prompt)
                for s in seqs]
        for method, bits in configs:
            r = measure(model, seqs, args.prompt, refs, cache_kwargs(method, bits, args))
            r = {"method": method, "bits": bits, "head_dim": d, **r}
            rows.append(r)
            done += 1
            print(f"{method:<16} {bits:>4} {d:>4} {r['bits_per_coord']:>10.3f} {r['kl_mean']:>10.3e} "
                  f"{r['kl_max']:>10.3e} {r['top1_agree']:>6.1%}   [{done}/{total}, "
                  f"{time.time() - t0:.0f}s]", flush=True)
    result = {
        "tool": "veloxquant quality",
        "command": getattr(args, "command_line", None) or " ".join(["veloxquant", *sys.argv[1:]]),
        "date": utc_now_iso(),
        "versions": versions(),
        "device": str(mx.default_device()),
        "settings": {"model": "mlx_lm llama, random init, 2 layers, hidden 256, 4 query / 2 KV heads, "
                              f"vocab {VOCAB}, float16",
                     "reference": "mlx_lm KVCache (float16)", "head_dims": args.head_dims,
                     "prompt": args.prompt, "steps": args.steps, "sequences": args.sequences,
                     "window": args.window, "kivi_group_size": args.group_size, "seed": args.seed,
                     "turboquant_rvq_bits2": "equal to bits"},
        "results": rows,
    }
    if not args.json:
        print("nothing written (--json PATH [--markdown PATH] to keep the results)")
        return 0
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")
    return write_docs(result, args.json, args.markdown) if args.markdown else 0


def write_docs(result: dict, json_path: pathlib.Path, markdown: pathlib.Path) -> int:
    """The figure (if matplotlib is there) and the markdown that embeds it."""
    from . import plots

    png, why = plots.quality_plot(result, markdown.with_suffix(".png"))
    print(f"wrote {png}" if png else f"plot skipped: {why}")
    markdown.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text(render_markdown(result, json_path, png.name if png else None))
    print(f"wrote {markdown}")
    return 0


def render_markdown(result: dict, json_path: pathlib.Path, figure: str | None = None) -> str:
    s, v = result["settings"], result["versions"]
    try:
        json_name = json_path.resolve().relative_to(ROOT)
    except ValueError:
        json_name = json_path
    lines = [
        "# Quality: next-token KL divergence vs the fp16 cache",
        "",
        f"Generated by `{result['command']}` on {result['date']} ({result['device']}); raw data in "
        f"`{json_name}`. Do not edit by hand.",
        "",
        f"Model: {s['model']}. Reference: {s['reference']}. Each configuration reads {s['sequences']} "
        f"random token sequences of {s['prompt']} prefill + {s['steps']} teacher-forced decode tokens; KL "
        "(nats, float64) and top-1 agreement are over every position after the prefill. All layers use the "
        f"method for keys and values; window R = {s['window']}; kivi group size {s['kivi_group_size']}; "
        f"turboquant_rvq bits2 = bits; seed {s['seed']}. Bits/coord is measured: the caches' `nbytes` "
        "(codes, side information and any window tokens in float16) over stored coordinates.",
        "",
        "These are random models: use the table to compare methods and bit widths with each other, not to "
        "predict quality on a trained model.",
        "",
        f"Versions: spec {v['spec']}, veloxquant {v['veloxquant']} (git {v['git']}), mlx {v['mlx']}, "
        f"mlx-lm {v['mlx-lm']}, numpy {v['numpy']}, Python {v['python']}.",
        "",
    ]
    if figure:  # relative to the markdown: both live in the same folder
        lines += [f"![Mean KL (log scale) against measured bits per coordinate, one line per method, one "
                  f"panel per head dim; point labels are the configured bits]({figure})", "",
                  "Lower and further left is better; labels next to the points are the configured bit widths.",
                  ""]
    lines += [
        "| method | bits | head dim | bits/coord | KL mean | KL median | KL max | top-1 agree |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["results"]:
        lines.append(f"| {r['method']} | {r['bits']} | {r['head_dim']} | {r['bits_per_coord']:.3f} | "
                     f"{r['kl_mean']:.3e} | {r['kl_median']:.3e} | {r['kl_max']:.3e} | "
                     f"{r['top1_agree']:.1%} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # `python -m veloxquant.tools.quality ...`, same arguments as `veloxquant quality`
    import argparse

    parser = argparse.ArgumentParser(prog="python -m veloxquant.tools.quality", description=__doc__.splitlines()[0])
    add_arguments(parser)
    ns = parser.parse_args()
    ns.command_line = " ".join(["python -m veloxquant.tools.quality", *sys.argv[1:]])
    sys.exit(run(ns))
