"""`veloxquant` command line: one entry point, one module per subcommand.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`.
"""
from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "golden": ("tools.golden", "regenerate or check the golden vectors"),
    "codebooks": ("tools.codebooks_cmd", "regenerate or check spec/codebooks.toml"),
    "conformance": ("tools.conformance", "run the conformance suite and print/write a report"),
    "bench": ("tools.bench", "benchmarks (speed); writes JSON / markdown only with --json / --markdown"),
    "bench-decode": ("tools.bench_decode", "decode-step benchmark: per-layer step and generation, every cache"),
    "quality": ("tools.quality", "KL divergence of next-token logits per method and bits"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="veloxquant", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (modname, helptext) in SUBCOMMANDS.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=helptext, description=helptext)
        mod.add_arguments(p)
        modules[name] = mod
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
