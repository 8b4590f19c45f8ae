"""`veloxquant codebooks regen|check`: spec/codebooks.toml from tools/codebookgen.py."""
from __future__ import annotations

import pathlib

from tools import codebookgen

TARGET = pathlib.Path(__file__).resolve().parent.parent / "spec" / "codebooks.toml"


def add_arguments(p) -> None:
    p.add_argument("action", choices=["regen", "check"])


def run(args) -> int:
    text = codebookgen.render_toml(codebookgen.generate())
    if args.action == "regen":
        TARGET.write_text(text)
        print(f"wrote {TARGET}")
        return 0
    if TARGET.read_text() != text:
        print(f"FAIL: {TARGET} differs from the generator's output; run `veloxquant codebooks regen`")
        return 1
    print(f"ok: {TARGET} matches the generator bit for bit")
    return 0
