"""`veloxquant generate`: mlx-lm's own `mlx_lm.generate` command with our KV caches.

The --kv-* flags choose the cache (tools/cli/kv_flags.py); every other flag (--model, --prompt, --max-tokens,
--temp, ...) is mlx_lm.generate's and goes to it unchanged, so the output (the text, then prompt and
generation tokens-per-second and peak memory) is mlx-lm's. mlx-lm's own --kv-bits/--kv-group-size are
replaced by ours. The whole configuration is checked first (kv_flags.check: the flags and the model's
config.json), so a bad one is one line and exit 2 before any weight loads or any output.
"""
from __future__ import annotations

import sys

from . import kernels as kernels_cmd, kv_flags

PASSTHROUGH = True       # tools/cli/ hands the flags it does not know to run() as args.passthrough


def add_arguments(p) -> None:
    kv_flags.add_arguments(p)
    p.epilog = "Other flags go to mlx_lm.generate (see `python -m mlx_lm generate --help`)."


def run(args) -> int:
    made: list = []
    try:
        s = kv_flags.check(args)
    except kv_flags.FlagError as e:
        print(f"veloxquant generate: {e}", file=sys.stderr)
        return kv_flags.USAGE_EXIT
    kv_flags.install(s, keep=made)
    print(f"[veloxquant] KV cache: {kv_flags.describe(s)}", file=sys.stderr, flush=True)
    kernels_cmd.ensure_warm(args.model, s, batch=False)
    from mlx_lm import generate as _pkg  # noqa: F401  (the package import binds mlx_lm.generate to a function)
    gen = sys.modules["mlx_lm.generate"]
    argv = sys.argv
    sys.argv = ["mlx_lm.generate", "--model", args.model, *args.passthrough]
    try:
        gen.main()
    finally:
        sys.argv = argv
    if made:        # with --draft-model, mlx-lm makes the model's caches, then the draft model's
        names = ["", " (draft model)"] if s["exact_trim"] and len(made) >= 2 else [""]
        for name, caches in zip(names, made[-len(names):]):
            print(f"[veloxquant] KV cache at the end{name}: {kv_flags.report(caches)}", flush=True)
    return 0
