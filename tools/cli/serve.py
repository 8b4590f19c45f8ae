"""`veloxquant serve`: mlx-lm's HTTP server (`mlx_lm.server`, OpenAI-style /v1/completions and
/v1/chat/completions) with our KV caches.

The --kv-* flags choose the cache (tools/cli/kv_flags.py); every other flag (--model, --host, --port,
--prompt-cache-size, --decode-concurrency, ...) is mlx_lm.server's and goes to it unchanged. Requests are
batched by mlx-lm's BatchGenerator over our batch caches (accelerated/cache/batch.py) and their caches are
kept for prompt reuse in mlx-lm's LRUPromptCache, as with mlx-lm's fp16 cache. --model is required here (mlx-lm's
server would take the model from each request): the cache flags are checked against its config.json before the
server starts (kv_flags.check; a bad configuration is one line and exit 2).
"""
from __future__ import annotations

import sys

from . import kernels as kernels_cmd, kv_flags

PASSTHROUGH = True


def add_arguments(p) -> None:
    kv_flags.add_arguments(p)
    p.epilog = "Other flags go to mlx_lm.server (see `python -m mlx_lm server --help`)."


def run(args) -> int:
    try:
        s = kv_flags.check(args)
    except kv_flags.FlagError as e:
        print(f"veloxquant serve: {e}", file=sys.stderr)
        return kv_flags.USAGE_EXIT
    kv_flags.install(s)
    print(f"[veloxquant] KV cache: {kv_flags.describe(s)}", file=sys.stderr, flush=True)
    kernels_cmd.ensure_warm(args.model, s)
    import mlx_lm.server as server
    argv = sys.argv
    sys.argv = ["mlx_lm.server", "--model", args.model, *args.passthrough]
    try:
        server.main()
    finally:
        sys.argv = argv
    return 0
