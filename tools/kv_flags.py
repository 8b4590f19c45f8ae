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
                fp16_layers=tuple(args.kv_fp16_layers), seed=args.kv_seed)


def describe(s: dict) -> str:
    km, vm = s["key_method"] or s["method"], s["value_method"] or s["method"]
    kb = s["key_bits"] if s["key_bits"] is not None else s["bits"]
    vb = s["value_bits"] if s["value_bits"] is not None else s["bits"]
    bits = lambda b: "default bits" if b is None else f"{b} bits"        # noqa: E731
    window = "method default" if s["window"] is None else s["window"]
    return (f"keys {km} ({bits(kb)}), values {vm} ({bits(vb)}), window {window}, "
            f"fp16 layers first {s['fp16_layers'][0]} / last {s['fp16_layers'][1]}")


def install(args, keep: list | None = None) -> dict:
    """Install our caches into mlx-lm's entry points (accelerated.cache.serve); ValueError on bad flags."""
    import veloxquant.accelerated.cache.serve as serve
    s = settings(args)
    serve.install(keep=keep, **s)
    return s


def report(caches: list) -> str:
    """One line on a prompt cache: tokens, bytes stored, and what mlx-lm's fp16 KVCache would hold."""
    from veloxquant.accelerated.cache import VeloxKVCache
    ours = [c for c in caches if isinstance(c, VeloxKVCache) and not c.empty()]
    if not ours:
        return "no tokens in a VeloxQuant cache"
    tokens = ours[0].offset
    stored = sum(c.nbytes for c in ours)
    fp16 = 0
    for c in ours:
        b, h, _, d = c._k.record()["window"].shape
        fp16 += 2 * b * h * c.offset * d * 2           # keys and values, float16
    return (f"{tokens} tokens; {len(ours)} of {len(caches)} layers compressed: {stored / 1024:.1f} KiB "
            f"(the same tokens in float16: {fp16 / 1024:.1f} KiB, ratio {stored / fp16:.3f})")
