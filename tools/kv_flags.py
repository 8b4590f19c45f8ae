"""The KV-cache flags of `veloxquant generate` and `veloxquant serve` (accelerated.cache.make_prompt_cache's
arguments); every other flag goes to mlx-lm's own command unchanged."""
from __future__ import annotations

import argparse

from veloxquant import spec

CACHE_METHODS = [m for m in spec.METHODS if m != "mlx_affine"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("KV cache (VeloxQuant)")
    g.add_argument("--kv-method", default="turboquant", choices=CACHE_METHODS,
                   help="method for keys and values (default turboquant)")
    g.add_argument("--kv-bits", type=int, default=None, help="bits for keys and values (method default if omitted)")
    g.add_argument("--kv-key-method", default=None, help="method for keys only (overrides --kv-method)")
    g.add_argument("--kv-value-method", default=None, help="method for values only")
    g.add_argument("--kv-key-bits", type=int, default=None, help="bits for keys only")
    g.add_argument("--kv-value-bits", type=int, default=None, help="bits for values only")
    g.add_argument("--kv-bits2", type=int, default=None, help="turboquant_rvq: bits of the residual stage")
    g.add_argument("--kv-group-size", type=int, default=None, help="kivi: group size G")
    g.add_argument("--kv-window", type=int, default=None,
                   help="newest tokens kept exactly (spec `window` R; method default if omitted)")
    g.add_argument("--kv-fp16-layers", type=int, nargs=2, default=(0, 0), metavar=("FIRST", "LAST"),
                   help="keep mlx-lm's fp16 KVCache for the first FIRST and last LAST layers")
    g.add_argument("--kv-seed", type=int, default=0, help="spec seed (rotation signs)")


def settings(args) -> dict:
    """accelerated.cache.make_prompt_cache keyword arguments from the parsed flags."""
    return dict(method=args.kv_method, bits=args.kv_bits, key_method=args.kv_key_method,
                value_method=args.kv_value_method, key_bits=args.kv_key_bits, value_bits=args.kv_value_bits,
                bits2=args.kv_bits2, group_size=args.kv_group_size, window=args.kv_window,
                fp16_layers=tuple(args.kv_fp16_layers), seed=args.kv_seed, exact_trim=draft_tokens(args))


def draft_tokens(args) -> int:
    """The caches' exact_trim E: mlx-lm's --num-draft-tokens when its --draft-model is among the flags passed to
    it (speculative decoding trims at most that many tokens per step), else 0 (no exact copies: a trim past the
    window is then not exact, and the cache never holds more than float16 would)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--draft-model", default=None)
    p.add_argument("--num-draft-tokens", type=int, default=3)      # mlx_lm.generate's and mlx_lm.server's default
    known, _ = p.parse_known_args(list(getattr(args, "passthrough", None) or []))
    if known.draft_model is None:
        return 0
    if known.num_draft_tokens < 0:
        raise ValueError(f"--num-draft-tokens: must be >= 0, got {known.num_draft_tokens}")
    return known.num_draft_tokens


def describe(s: dict) -> str:
    km, vm = s["key_method"] or s["method"], s["value_method"] or s["method"]
    kb = s["key_bits"] if s["key_bits"] is not None else s["bits"]
    vb = s["value_bits"] if s["value_bits"] is not None else s["bits"]
    bits = lambda b: "default bits" if b is None else f"{b} bits"        # noqa: E731
    window = "method default" if s["window"] is None else s["window"]
    e = s.get("exact_trim", 0)
    trims = (f"exact trims of up to {e} tokens (--draft-model)" if e else "no exact-trim copies")
    return (f"keys {km} ({bits(kb)}), values {vm} ({bits(vb)}), window {window}, "
            f"fp16 layers first {s['fp16_layers'][0]} / last {s['fp16_layers'][1]}, {trims}")


def install(args, keep: list | None = None) -> dict:
    """Install our caches into mlx-lm's entry points (accelerated.cache.serve); ValueError on bad flags."""
    import veloxquant.accelerated.cache.serve as serve
    s = settings(args)
    serve.install(keep=keep, **s)
    return s


def report(caches: list) -> str:
    """One line on a prompt cache: tokens, bytes stored, what mlx-lm's fp16 KVCache would hold for the same
    tokens, and what the bytes are (VeloxKVCache.nbytes_parts): encoded records, the exact window, exact-trim
    copies, per compressed layer."""
    from veloxquant.accelerated.cache import VeloxKVCache, size
    ours = [c for c in caches if isinstance(c, VeloxKVCache) and not c.empty()]
    if not ours:
        return "no tokens in a VeloxQuant cache"
    tokens = ours[0].offset
    parts = size.add(*(c.nbytes_parts for c in ours))
    stored = sum(parts.values())
    fp16 = 0
    for c in ours:
        b, h, _, d = c._k.record()["window"].shape
        fp16 += 2 * b * h * c._k.tokens * d * 2           # keys and values, float16, the tokens the layer holds
    n = len(ours)
    streams = [s for c in ours for s in (c._k, c._v)]   # counts per compressed layer, keys and values averaged
    q = sum(s._q for s in streams) / len(streams)
    window = sum(s.tokens for s in streams) / len(streams) - q
    kept = sum(0 if s._kept is None else s._kept.shape[2] for s in streams) / len(streams)
    kib = lambda b: f"{b / 1024:.1f} KiB"          # noqa: E731
    per = f"{parts['encoded'] / n / q:.0f} B/token/layer" if q else "none yet"
    return (f"{tokens} tokens; {n} of {len(caches)} layers compressed: {kib(stored)} "
            f"(the same tokens in float16: {kib(fp16)}, ratio {stored / fp16:.3f}) = "
            f"{kib(parts['encoded'])} records of {q:g} encoded tokens ({per}; float16 "
            f"{fp16 / n / (q + window):.0f}) + {kib(parts['window'])} window of {window:g} exact tokens + "
            f"{kib(parts['kept'])} exact-trim copies of {kept:g} tokens")
