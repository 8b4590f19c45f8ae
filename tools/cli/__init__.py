"""`veloxquant` command line: one entry point, one module per subcommand.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`; one with `PASSTHROUGH = True`
(generate, serve: thin wrappers of mlx-lm's commands) gets the flags it does not define as `args.passthrough`.
A command whose extra (tools/cli/extras.py) is not installed prints one line naming it and exits 2 before any
work; `--help` works without it.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from . import extras

SUBCOMMANDS = {
    "golden": ("veloxquant.tools.golden", "regenerate or check the golden vectors"),
    "codebooks": ("veloxquant.tools.cli.codebooks", "regenerate or check spec/codebooks.toml"),
    "conformance": ("veloxquant.tools.cli.conformance", "run the conformance suite and print/write a report"),
    "bench": ("veloxquant.tools.bench", "benchmarks (speed): runs `pytest benchmarks` on a device, saves its JSON, renders it"),
    "quality": ("veloxquant.tools.quality", "KL divergence of next-token logits per method and bits"),
    "generate": ("veloxquant.tools.cli.generate", "mlx-lm's generate with our KV caches (--kv-* flags; others go to mlx-lm)"),
    "serve": ("veloxquant.tools.cli.serve", "mlx-lm's HTTP server with our KV caches (--kv-* flags; others go to mlx-lm)"),
    "distortion": ("veloxquant.tools.quality.distortion", "distortion of every method beside the papers' figures and bounds; bit-budget recommendation"),
    "kernels": ("veloxquant.tools.cli.kernels", "GPU kernel cache: warm up a configuration (compile once per machine), status, clear"),
    "memory": ("veloxquant.tools.bench.memory", "peak memory of prefill and decode: our caches vs mlx-lm's fp16 KVCache"),
}
# the extras (tools/cli/extras.py) each command imports; bench runs without mlx-lm (its benchmarks that need it skip)
NEEDS = {"conformance": ("conformance",), "quality": ("lm",), "generate": ("lm",), "serve": ("lm",), "memory": ("lm",)}


def needs(command: str, args) -> tuple[str, ...]:
    """The extras `command` needs with these arguments."""
    return NEEDS.get(command, ())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="veloxquant", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (modname, helptext) in SUBCOMMANDS.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=helptext, description=helptext)
        mod.add_arguments(p)
        modules[name] = mod
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(modules[args.command], "PASSTHROUGH", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.passthrough = rest
    missing = extras.message(f"veloxquant {args.command}", *needs(args.command, args))
    if missing:
        print(missing, file=sys.stderr)
        return extras.MISSING_EXTRA_EXIT
    return int(modules[args.command].run(args) or 0)

