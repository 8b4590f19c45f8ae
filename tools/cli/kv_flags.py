"""The KV-cache flags of `veloxquant generate` and `veloxquant serve` (accelerated.cache.make_prompt_cache's
arguments) and their validation; every other flag goes to mlx-lm's own command unchanged.

`check(args)` validates the whole configuration before mlx-lm loads any weight or prints anything: each role's
method, bits, bits2, group size, window and seed (spec.Params), flags given to a method that does not take
them, and the cache against the model's config.json (number of layers for --kv-fp16-layers, head dim for the
head-dim rules). Its errors (FlagError) are one line naming the flag the user typed (`--kv-bits`, not the
library's `key_bits`); the commands print it and exit 2, argparse's usage status.
"""
from __future__ import annotations

import argparse
import json
import logging
import pathlib

from ... import spec

CACHE_METHODS = list(spec.METHODS)
USAGE_EXIT = 2
# mlx-lm flags that would silently bypass our caches (mlx-lm then builds its own rotating fp16 cache)
REFUSED = {"--max-kv-size": "it makes mlx-lm build its own rotating fp16 cache for every layer instead of ours "
                            "(VeloxQuant caches keep the whole context); drop it, or run mlx_lm.generate"}


class FlagError(ValueError):
    """A configuration error, worded with the flag the user typed."""


def add_arguments(p: argparse.ArgumentParser, model: bool = True) -> None:
    if model:
        p.add_argument("--model", required=True,
                       help="model directory (or Hugging Face repo) for mlx-lm; its config.json is checked "
                            "against the cache flags before the weights load")
    g = p.add_argument_group("KV cache (VeloxQuant)")
    g.add_argument("--kv-method", default="turboquant", choices=CACHE_METHODS,
                   help="method for keys and values (default turboquant)")
    g.add_argument("--kv-bits", type=int, default=None, help="bits for keys and values (method default if omitted)")
    g.add_argument("--kv-key-method", default=None, choices=CACHE_METHODS,
                   help="method for keys only (overrides --kv-method)")
    g.add_argument("--kv-value-method", default=None, choices=CACHE_METHODS, help="method for values only")
    g.add_argument("--kv-key-bits", type=int, default=None, help="bits for keys only")
    g.add_argument("--kv-value-bits", type=int, default=None, help="bits for values only")
    g.add_argument("--kv-bits2", type=int, default=None, help="turboquant_rvq: bits of the residual stage")
    g.add_argument("--kv-group-size", type=int, default=None, help="kivi, mlx_affine: group size G")
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


def _role_params(args, role: str) -> spec.Params:
    """One role's resolved spec.Params; FlagError names the flag that supplied the bad value."""
    own_method, own_bits = getattr(args, f"kv_{role}_method"), getattr(args, f"kv_{role}_bits")
    method = own_method or args.kv_method
    bits, bits_flag = (own_bits, f"--kv-{role}-bits") if own_bits is not None else (args.kv_bits, "--kv-bits")
    takes_groups = "group_sizes" in spec.method_info(method)
    p = spec.Params(method, bits=bits, bits2=args.kv_bits2 if method == "turboquant_rvq" else None,
                    group_size=args.kv_group_size if takes_groups else None, window=args.kv_window,
                    seed=args.kv_seed, role=role[0])
    flags = {"bits": bits_flag, "bits2": "--kv-bits2", "group_size": "--kv-group-size", "window": "--kv-window",
             "seed": "--kv-seed"}
    try:
        return p.resolved()
    except ValueError as e:
        raise _renamed(e, flags, f"{method}, {role}s") from None


def _renamed(e: ValueError, flags: dict, where: str) -> FlagError:
    """The library's `name: message` as `--flag: message (where)`."""
    name, _, rest = str(e).partition(":")
    if name in flags:
        return FlagError(f"{flags[name]}: {rest.strip()} ({where})")
    return FlagError(f"{e} ({where})")


def check_flags(args) -> dict:
    """The cache settings from the flags, every value checked against the spec and the methods chosen."""
    roles = {role: _role_params(args, role) for role in ("key", "value")}
    used = sorted({p.method for p in roles.values()})
    if args.kv_bits2 is not None and "turboquant_rvq" not in used:
        raise FlagError(f"--kv-bits2: only turboquant_rvq takes a residual width; this cache uses {' and '.join(used)}")
    if args.kv_group_size is not None and not any("group_sizes" in spec.method_info(m) for m in used):
        takers = ", ".join(m for m in spec.METHODS if "group_sizes" in spec.method_info(m))
        raise FlagError(f"--kv-group-size: {' and '.join(used)} take no group size (only {takers} do)")
    first, last = args.kv_fp16_layers
    if first < 0 or last < 0:
        raise FlagError(f"--kv-fp16-layers: expected two non-negative counts, got {first} {last}")
    for flag in REFUSED:
        if any(a == flag or a.startswith(flag + "=") for a in getattr(args, "passthrough", ())):
            raise FlagError(f"{flag}: not supported with VeloxQuant caches: {REFUSED[flag]}")
    s = settings(args)
    s["_params"] = roles
    return s


def model_config(model: str) -> dict:
    """The model's config.json, read without loading weights: from a local directory, or (for a Hugging Face
    repo id) fetched alone into the Hub cache mlx-lm loads from. FlagError (naming --model) otherwise."""
    path = pathlib.Path(model).expanduser()
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise FlagError(f"--model {model}: no config.json in this directory (an mlx-lm model directory has one)")
        try:
            return json.loads(cfg.read_text())
        except (OSError, ValueError) as e:
            raise FlagError(f"--model {model}: cannot read config.json ({type(e).__name__}: {e})") from None
    if path.exists():
        raise FlagError(f"--model {model}: not a directory (give an mlx-lm model directory or a Hugging Face repo)")
    if model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise FlagError(f"--model {model}: no such directory, and not a Hugging Face repo id (owner/name)")
    from huggingface_hub import hf_hub_download   # (imported first: its import sets its logger's level)
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)          # its retry warnings would print several lines before ours
    try:
        return json.loads(pathlib.Path(hf_hub_download(model, "config.json")).read_text())
    except Exception as e:  # noqa: BLE001  (network, auth, missing repo: one line, not the Hub's traceback)
        first = (str(e).strip().splitlines() or [""])[0].split(". ")[0][:200]
        raise FlagError(f"--model {model}: no such directory, and its config.json could not be fetched from the "
                        f"Hugging Face Hub ({type(e).__name__}: {first})") from None
    finally:
        hub_log.setLevel(level)


def model_shape(config: dict) -> tuple[int | None, int | None]:
    """(layers, head dim) from an mlx-lm config.json (a `text_config` inside wins); None where it does not say
    or where keys and values have other widths (latent attention: the caches' own checks apply at run time)."""
    c = config.get("text_config") or config
    layers = c.get("num_hidden_layers", c.get("n_layers"))
    if any(k in c for k in ("kv_lora_rank", "v_head_dim", "qk_nope_head_dim")):
        return layers, None
    d = c.get("head_dim")
    if d is None and c.get("hidden_size") and c.get("num_attention_heads"):
        d = c["hidden_size"] // c["num_attention_heads"]
    return (layers if isinstance(layers, int) else None), (d if isinstance(d, int) else None)


def check_model(s: dict, model: str, config: dict) -> None:
    """The settings against the model: fp16 layers leave one compressed, each role's head-dim rules hold."""
    layers, d = model_shape(config)
    first, last = s["fp16_layers"]
    if layers is not None and first + last >= layers:
        raise FlagError(f"--kv-fp16-layers {first} {last}: keeps all {layers} layers of {model} in fp16, so nothing "
                        f"would be compressed (FIRST + LAST must be at most {layers - 1})")
    if d is None:
        return
    for role, p in s["_params"].items():
        try:
            p.check_head_dim(d)
        except ValueError as e:
            if str(e).startswith("x:"):
                raise FlagError(f"--model {model}: head dim {d} is not one VeloxQuant supports "
                                f"(supported: {', '.join(map(str, spec.HEAD_DIMS))})") from None
            raise _renamed(e, {"group_size": "--kv-group-size"}, f"config.json of {model}") from None


def check(args) -> dict:
    """Everything checked before any weight loads: the flags, then the model's config.json."""
    s = check_flags(args)
    check_model(s, args.model, model_config(args.model))
    return s


def install(s: dict, keep: list | None = None) -> None:
    """Install our caches with checked settings `s` into mlx-lm's entry points (accelerated.cache.serve)."""
    from ...accelerated.cache import serve as serve
    serve.install(keep=keep, **{k: v for k, v in s.items() if not k.startswith("_")})


def report(caches: list) -> str:
    """One line on a prompt cache: tokens, bytes stored, what mlx-lm's fp16 KVCache would hold for the same
    tokens, and what the bytes are (VeloxKVCache.nbytes_parts): encoded records, the exact window, exact-trim
    copies, per compressed layer."""
    from ...accelerated.cache import VeloxKVCache, size
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
