"""`veloxquant golden regen|check`: golden vectors, produced only from the numpy reference.

Layout of golden/ (spec/README.md "Versioning"; the manifest records the spec version), and the module of
this package that writes each file. A new spec version adds files and never changes an earlier file's bytes.

- `manifest.toml`: spec/generator version, each file's sha256, one `[[case]]` per method case (write);
- `cases/<method>.toml` (edge cases, hex bit patterns), `bulk/<method>.npz` (the random grid, windows and
  streams): cases (spec/methods/*.md, streaming.md);
- `cases/{prng,rotation,packing,codebooks}.toml`: component vectors of the shared building blocks: generate
  (rotation.md, packing.md, codebooks.md);
- `cases/<method>-rules.toml`: one case per rule the method tables do not pin: rules (rules.toml), and the
  exact trims: exact_trim (streaming.md);
- `bulk/<method>-headdims.npz`, `cases/headdims.toml`: the head dims d = m·2^k: head_dims (formats.toml);
- `bulk/<method>-wide.npz`: B = 4 and H = 8 or 9: wide;
- `cases/<method>-rules12.toml`, `cases/cast.toml`: trims past the window, rejected chunks, parameter and
  decode errors; the casts: stream_rules (streaming.md, number-model.md);
- `bulk/attention.npz`: attention outputs and their budgets: attention (attention.md).

npz files are stored uncompressed with a fixed zip timestamp, so their bytes are a function of the content.
Case kinds: `encode` (one-shot encode + decode), `stream` (appends/trims/rejected appends/save-load on
reference.stream.Stream, then decode of the final record), `error` (encode must raise the named exception
mentioning the argument).

The case list is code; inputs come from a private counter-based RNG with exact integer arithmetic (inputs.py;
not numpy's Generator, whose streams may change between numpy versions), so `check` can rebuild every input
and every expected value in memory and compare bit for bit.
Adding a method: add its name to `spec.METHODS` (bits/group sizes come from spec/formats.toml).

Modules by job: conformance/golden_format.py (codec, readers, manifest entries, replay; shared with the
suite), inputs (input RNG), ties (tie inputs), the case tables above, generate (expected values from the
reference), write (TOML/npz writers, manifest), compare (check); this module: the CLI and `regen`, and the
names the tests use.
"""
from __future__ import annotations

import time

from ...conformance.golden_format import (COMPONENT_FILES, ROOT, STREAM_OPS, GoldenCase, ReplayMismatch, _root,
                                       iter_cases, iter_vectors, load_manifest, on_disk_files, replay)

from .cases import METHOD_ORDER, available_methods
from .ties import find_tie_inputs, verify_tie
from .compare import compare
from .generate import _reference_reload, build, generate_cases
from .write import GENERATOR_VERSION

__all__ = ["COMPONENT_FILES", "STREAM_OPS", "GENERATOR_VERSION", "METHOD_ORDER", "ROOT", "GoldenCase", "ReplayMismatch",
           "available_methods", "build", "check", "compare", "find_tie_inputs", "generate_cases", "iter_cases",
           "iter_vectors", "load_manifest", "on_disk_files", "regen", "replay", "verify_tie",
           "_reference_reload"]


def check(root=None, methods=None) -> list[str]:
    cases, _comps, files = build(methods)
    return compare(root, cases, files)


def regen(root=None, methods=None) -> dict[str, bytes]:
    root = _root(root)
    _cases, _comps, files = build(methods)
    for f in on_disk_files(root) - set(files):
        (root / f).unlink()
    for f, data in files.items():
        p = root / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return files



# ----------------------------------------------------------------------------------------------------
# CLI

def add_arguments(p) -> None:
    p.add_argument("action", choices=["regen", "check", "list"])
    p.add_argument("--golden-dir", default=None, help="golden/ directory (default: the repository's)")
    p.add_argument("--method", action="append", default=None, help="restrict to a method (list only)")


def run(args) -> int:
    root = _root(args.golden_dir)
    t0 = time.perf_counter()
    if args.action == "list":
        for c in iter_cases(root, methods=args.method):
            print(f"{c.id:60s} {c.kind:7s} {','.join(c.flags):28s} {c.comment}")
        return 0
    if args.action == "regen":
        files = regen(root)
        total = sum(len(v) for v in files.values())
        print(f"wrote {len(files)} files ({total / 1e6:.2f} MB) to {root} in {time.perf_counter() - t0:.1f} s")
        return 0
    problems = check(root)
    n = len(load_manifest(root).get("case", [])) if (root / "manifest.toml").is_file() else 0
    if problems:
        for line in problems[:200]:
            print(f"FAIL {line}")
        if len(problems) > 200:
            print(f"... and {len(problems) - 200} more")
        print(f"golden check: {len(problems)} problem(s) in {root}")
        return 1
    print(f"ok: {n} cases and all component vectors in {root} match the reference bit for bit "
          f"({time.perf_counter() - t0:.1f} s)")
    return 0
