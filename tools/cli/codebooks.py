"""`veloxquant codebooks regen|check`: spec/codebooks.toml, and the head-dim constants s_d and A_d in
spec/formats.toml (`[scale]`, `[qjl_scale]`, one entry per `head_dims` entry), from tools/cli/codebookgen.py."""
from __future__ import annotations

import pathlib
import re
import sys

from . import codebookgen

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SPEC = pathlib.Path(__file__).resolve().parents[2] / "spec"
TARGET = SPEC / "codebooks.toml"
FORMATS = SPEC / "formats.toml"


def add_arguments(p) -> None:
    p.add_argument("action", choices=["regen", "check"])


def formats_text(text: str) -> str:
    """formats.toml's text with the key lines of [scale] and [qjl_scale] regenerated for its head_dims
    (the section headers, their comments and everything else kept as written)."""
    consts = codebookgen.head_dim_constants(tomllib.loads(text)["head_dims"])
    for name, values in consts.items():
        body = "".join(f'{d} = "{v}"\n' for d, v in values.items())
        text, n = re.subn(rf"(^\[{name}\][^\n]*\n)(?:[0-9]+ = \"[^\"]*\"\n)*", lambda m: m.group(1) + body,
                          text, flags=re.M)
        if n != 1:
            raise ValueError(f"{FORMATS}: expected one [{name}] section, found {n}")
    return text


def run(args) -> int:
    text = codebookgen.render_toml(codebookgen.generate())
    fmt_now = FORMATS.read_text()
    fmt = formats_text(fmt_now)
    if args.action == "regen":
        TARGET.write_text(text)
        FORMATS.write_text(fmt)
        print(f"wrote {TARGET} and the [scale], [qjl_scale] sections of {FORMATS}")
        return 0
    bad = [str(p) for p, now, want in ((TARGET, TARGET.read_text(), text), (FORMATS, fmt_now, fmt)) if now != want]
    if bad:
        print(f"FAIL: {', '.join(bad)} differ(s) from the generator's output; run `veloxquant codebooks regen`")
        return 1
    print(f"ok: {TARGET} and the head-dim constants in {FORMATS} match the generator bit for bit")
    return 0
