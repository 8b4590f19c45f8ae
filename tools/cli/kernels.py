"""`veloxquant kernels`: the GPU kernel cache (accelerated/kernels/kernel_cache.py).

    veloxquant kernels warmup --model PATH [--kv-* flags]    compile every variant that cache configuration
                                                            can launch (once per machine), with progress
    veloxquant kernels warmup --geometry 32 32 8 128 ...     the same for a layers/heads/kv-heads/head-dim shape
    veloxquant kernels status                               where the cache is, how many entries, how large
    veloxquant kernels clear                                remove it

`veloxquant generate` and `serve` call `ensure_warm` before their model loads: one line when the configuration
is warm, the warm-up with its progress when it is not. On Metal and on the CPU there is nothing to compile ahead
(MLX's Metal kernels compile in the process; the CPU runs the ops path).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import kv_flags


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("warmup", "status", "clear"))
    p.add_argument("--model", default=None, help="model folder (its config.json gives the attention geometry)")
    p.add_argument("--geometry", type=int, nargs=4, metavar=("LAYERS", "HEADS", "KV_HEADS", "HEAD_DIM"),
                   help="the attention geometry, instead of --model")
    p.add_argument("--dtype", default=None, choices=("float16", "bfloat16", "float32"),
                   help="activation dtype (default: the model's, float16 with --geometry)")
    p.add_argument("--workers", type=int, default=None, help="compiles at once (default min(8, CPUs))")
    p.add_argument("--no-batch", action="store_true", help="skip batched generation's variants")
    p.add_argument("--no-speculative", action="store_true", help="skip speculative decoding's variants")
    kv_flags.add_arguments(p, model=False)


def _bar(done: int, total: int) -> None:
    width = 30
    fill = width * done // max(total, 1)
    print(f"\r  compiling [{'#' * fill}{'.' * (width - fill)}] {done}/{total}", end="" if done < total else "\n",
          file=sys.stderr, flush=True)


def _config(model: str | None) -> dict | None:
    if model is None:
        return None
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"--model: no config.json in {model!r} (a local model folder is needed to warm up)")
    with open(path) as f:
        return json.load(f)


def _cuda() -> tuple[bool, str]:
    from ...accelerated.kernels import backend
    ok, why = backend.available()
    return ok and backend.backend() == "cuda", why


def ensure_warm(model: str | None, settings: dict, batch: bool = True,
                log=lambda s: print(s, file=sys.stderr, flush=True)) -> None:
    """Before the model loads: compile what the configuration needs if this machine has not yet (CUDA only);
    `batch`: also batched generation's variants (the server's; a one-shot generate needs none of them)."""
    ok, why = _cuda()
    if not ok or model is None or not os.path.isfile(os.path.join(model, "config.json")):
        return
    from ...accelerated.cache import warmup
    from ...accelerated.kernels import kernel_cache
    settings = {k: v for k, v in settings.items() if not k.startswith("_")}
    config = _config(model)
    geom = warmup.Geometry.of(config)
    n = warmup.is_warm(geom, settings, config, batch=batch)
    if n is not None:
        log(f"[veloxquant] kernels: {n} variants compiled for this configuration ({kernel_cache.store_dir()})")
        return
    log("[veloxquant] kernels: first use of this configuration on this machine, compiling (once) ...")
    r = warmup.warm(geom, settings, config, progress=_bar, batch=batch)
    log(f"[veloxquant] kernels: {r.variants} variants ready, {r.compiled} compiled in {r.seconds:.1f} s "
        f"({r.store})")


def run(args) -> int:
    from ...accelerated.kernels import kernel_cache
    if args.action == "clear":
        files, size = kernel_cache.clear()
        print(f"removed {files} files ({size / 2**20:.1f} MiB) from {kernel_cache.store_dir()} and MLX's "
              f"folder {kernel_cache.mlx_ptx_dir()}")
        return 0
    if args.action == "status":
        n, size = kernel_cache.usage()
        ok, why = _cuda()
        man = os.path.join(kernel_cache.store_dir(), "manifests")
        configs = len(os.listdir(man)) if os.path.isdir(man) else 0
        print(f"kernel cache: {kernel_cache.store_dir()}: {n} compiled variants, {size / 2**20:.1f} MiB, "
              f"{configs} warmed configurations; MLX's folder {kernel_cache.mlx_ptx_dir()}")
        print(f"backend: {why}" + ("" if ok else " (nothing to compile ahead here)"))
        return 0
    ok, why = _cuda()
    if not ok:
        print(f"veloxquant kernels warmup: {why}: nothing to compile ahead (CUDA only)", file=sys.stderr)
        return 0
    from ...accelerated.cache import warmup
    try:
        config = _config(args.model)
        if config is None and not args.geometry:
            raise ValueError("--model or --geometry is required")
        geom = warmup.Geometry.of(config, args.dtype) if config else warmup.Geometry(*args.geometry,
                                                                                     args.dtype or "float16")
    except ValueError as e:
        print(f"veloxquant kernels: {e}", file=sys.stderr)
        return 2
    settings = kv_flags.settings(args)
    print(f"veloxquant kernels warmup: {geom}; KV cache: {kv_flags.describe(settings)}", file=sys.stderr)
    r = warmup.warm(geom, settings, config, progress=_bar, workers=args.workers, batch=not args.no_batch,
                    speculative=not args.no_speculative)
    slow = sorted(kernel_cache.CACHE.seconds.values())
    if slow:
        print(f"compile seconds per variant: median {slow[len(slow) // 2]:.1f}, longest {slow[-1]:.1f}")
    print(f"{r.variants} variants, {r.compiled} compiled, {r.seconds:.1f} s; cache {r.store}: {r.store_entries} "
          f"entries, {r.store_bytes / 2**20:.1f} MiB")
    for m, why in r.failed.items():
        print(f"  not compiled (MLX will compile it in-process): {m}: {why.splitlines()[0]}", file=sys.stderr)
    return 1 if r.failed else 0
