"""The rule index (spec/rules.toml, spec 1.2): which golden cases and conformance tests pin each normative
rule `[R-…]` of spec/, and a per-rule verdict (passed / failed / not exercised) from test outcomes.

Selectors of a rule's `golden` list: `flag:<flag>` or `flag:<flag>@<method>` (golden method cases carrying the
flag), `case:<fnmatch pattern on the case id>`, `vector:<component file>` or `vector:<file>/<table>`,
`attention:<flag>` (golden attention cases). `tests`: `<file>::<function>` of conformance/, or
`tests/<file>::<function>` (project tests: listed, never run by the suite). `unpinnable`: the reason no
input can tell a deviation apart.
"""
from __future__ import annotations

import fnmatch
import functools
import pathlib
import re
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .. import spec

SPEC_DIR = pathlib.Path(spec.__file__).resolve().parent
SUITE_DIR = pathlib.Path(__file__).resolve().parent
RULE_ID = re.compile(r"`\[(R-[a-z0-9-]+)\]`")


def load(path=None) -> list[dict]:
    with open(path or SPEC_DIR / "rules.toml", "rb") as f:
        return tomllib.load(f)["rule"]


def spec_ids(spec_dir=None) -> dict[str, list[str]]:
    """Rule id -> the chapters (paths relative to spec/) whose text carries it."""
    d = pathlib.Path(spec_dir or SPEC_DIR)
    out: dict[str, list[str]] = {}
    for p in sorted(d.rglob("*.md")):
        for rid in RULE_ID.findall(p.read_text()):
            out.setdefault(rid, []).append(p.relative_to(d).as_posix())
    return out


def case_matches(selector: str, case) -> bool:
    """Does a `flag:` / `case:` selector select this golden method case (golden_format.GoldenCase)?"""
    kind, _, arg = selector.partition(":")
    if kind == "flag":
        flag, _, method = arg.partition("@")
        return flag in case.flags and (not method or case.method == method)
    if kind == "case":
        return fnmatch.fnmatchcase(case.id, arg)
    return False


def attention_matches(selector: str, case) -> bool:
    kind, _, arg = selector.partition(":")
    return kind == "attention" and arg in case.flags


def vector_ids(selector: str, root=None) -> list[str]:
    from . import golden_format as golden
    kind, _, arg = selector.partition(":")
    if kind != "vector":
        return []
    name, _, table = arg.partition("/")
    if name not in golden.COMPONENT_FILES:
        return []
    tables = golden.iter_vectors(name, root)
    return [e["id"] for t, entries in tables.items() if not table or t == table for e in entries]


def test_exists(ref: str, suite_dir=None) -> bool:
    """`file::function` (conformance/) or `tests/file::function` names a defined test function."""
    path, _, func = ref.partition("::")
    base = pathlib.Path(suite_dir or SUITE_DIR)
    p = base.parent / path if path.startswith("tests/") else base / path
    return p.is_file() and re.search(rf"^def {re.escape(func)}\(", p.read_text(), re.M) is not None


def problems(rules=None, spec_dir=None, root=None, suite_dir=None, cases=None) -> list[str]:
    """Everything that breaks the index: an id in spec/ text missing from rules.toml or the reverse, a rule
    pinned by nothing (and not `unpinnable`), a selector that selects no golden case, a test that does not
    exist, a golden case flag naming an unknown rule (`R-…` flags)."""
    rules = load() if rules is None else rules
    out = []
    in_text = spec_ids(spec_dir)
    ids = [r["id"] for r in rules]
    for rid in sorted({i for i in ids if ids.count(i) > 1}):
        out.append(f"{rid}: listed more than once in rules.toml")
    for rid in sorted(set(in_text) - set(ids)):
        out.append(f"{rid}: in spec/{in_text[rid][0]} but not in rules.toml")
    for rid in sorted(set(ids) - set(in_text)):
        out.append(f"{rid}: in rules.toml but no spec chapter carries it")
    for rid, chapters in sorted(in_text.items()):
        if len(chapters) > 1:
            out.append(f"{rid}: carried by more than one rule in the text ({chapters})")
    cases = _golden(str(root))[0] if cases is None else cases
    att = _golden(str(root))[1]
    for r in rules:
        sel, tests = r.get("golden", []), r.get("tests", [])
        if not sel and not tests and not r.get("unpinnable"):
            out.append(f"{r['id']}: pinned by no golden case and no test (and not marked unpinnable)")
        for s in sel:
            kind = s.partition(":")[0]
            if kind in ("flag", "case"):
                n = sum(case_matches(s, c) for c in cases)
            elif kind == "attention":
                n = sum(attention_matches(s, c) for c in att)
            elif kind == "vector":
                n = len(vector_ids(s, root))
            else:
                out.append(f"{r['id']}: unknown selector kind {s!r}")
                continue
            if n == 0:
                out.append(f"{r['id']}: selector {s!r} selects no golden case")
        for t in tests:
            if not test_exists(t, suite_dir):
                out.append(f"{r['id']}: test {t!r} does not exist")
    for c in cases:
        for f in c.flags:
            if f.startswith("R-") and f not in ids:
                out.append(f"{c.id}: flag {f!r} names an unknown rule")
    return out


@functools.lru_cache(maxsize=4)
def _golden(root: str):
    from . import golden_format as golden
    r = None if root == "None" else root
    return list(golden.iter_cases(r)), list(golden.iter_attention_cases(r))


def rules_of_item(nodeid: str, param, rules) -> list[str]:
    """Rule ids a collected conformance test item exercises: a golden case's by its selectors, any other test
    by its `file::function` in a rule's `tests`."""
    from . import golden_format as golden
    short = nodeid.split("conformance/", 1)[-1].split("[", 1)[0]
    out = [r["id"] for r in rules if short in r.get("tests", [])]
    if isinstance(param, golden.GoldenCase):
        out += [r["id"] for r in rules if any(case_matches(s, param) for s in r.get("golden", []))]
    elif isinstance(param, golden.AttentionCase):
        out += [r["id"] for r in rules if any(attention_matches(s, param) for s in r.get("golden", []))]
    elif short == "test_golden.py::test_golden_cast":
        out += [r["id"] for r in rules if any(s.startswith("vector:cast") for s in r.get("golden", []))]
    return sorted(set(out))


def verdicts(rules, outcomes: dict[str, str], item_rules: dict[str, list[str]]) -> dict[str, dict]:
    """Per rule: `failed` if a test exercising it failed, else `passed` if one passed, else `not exercised`
    (no test of it ran: deselected, skipped, or none exists, as for unpinnable rules)."""
    out = {}
    for r in rules:
        mine = [n for n, ids in item_rules.items() if r["id"] in ids]
        got = [outcomes.get(n, "not run") for n in mine]
        status = ("failed" if any(o in ("failed", "error") for o in got) else
                  "passed" if any(o == "passed" for o in got) else "not exercised")
        out[r["id"]] = {"status": status, "passed": got.count("passed"),
                        "failed": sum(o in ("failed", "error") for o in got),
                        "skipped": sum(o in ("skipped", "xfailed", "not run") for o in got),
                        "chapter": r["chapter"], "section": r["section"],
                        **({"unpinnable": r["unpinnable"]} if r.get("unpinnable") else {})}
    return out
