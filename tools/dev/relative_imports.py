"""Rewrite the library's absolute imports of its own modules to relative ones:
`python -m veloxquant.tools.dev.relative_imports [--check] [PATH ...]` (or `python tools/dev/relative_imports.py`).

`from veloxquant.accelerated.kernels import x` in accelerated/cache/base.py becomes `from ..kernels import x`: the
same module at run time, and a tool that reads files (an import-graph tool, an IDE, a type checker) finds
accelerated/cache/../kernels without following the veloxquant/ symlinks. Only the module part of a statement
changes, so aliases, comments, parenthesized multi-line imports and imports inside functions keep their place;
`import veloxquant.a.b as c` becomes `from ..a import b as c`. A bare `import veloxquant.a.b` that only makes sure
the submodule is loaded (the file never reads the name `veloxquant`) becomes `from ..a import b as _a_b`; one whose
dotted name is used, `import veloxquant` itself, and a multi-name `import` are left as they were and listed.
String arguments (importlib.import_module("veloxquant.x"), monkeypatch targets) are not imports and stay.

Deterministic and idempotent: a second run changes nothing. Default PATHs: the library folders spec, reference,
accelerated, conformance and tools of this checkout (not tests/, benchmarks/, docs/). --check writes nothing and
exits 1 when a file would change. Standard library only, so it runs before the package imports.
"""
from __future__ import annotations

import argparse
import ast
import io
import pathlib
import sys
import tokenize

NAMESPACE = "veloxquant"
LIBRARY = ("spec", "reference", "accelerated", "conformance", "tools")
ROOT = pathlib.Path(__file__).resolve().parents[2]


def package_of(path: pathlib.Path, root: pathlib.Path) -> list[str]:
    """The dotted package a file's module lives in (its folder under the namespace): accelerated/cache/base.py and
    accelerated/cache/__init__.py are both in veloxquant.accelerated.cache."""
    return [NAMESPACE, *path.relative_to(root).parts[:-1]]


def relative(target: list[str], package: list[str]) -> str:
    """The relative spelling of module `target` imported from `package`: one dot for the package itself, one more
    per level up to the common ancestor, then the rest of the target's path."""
    common = 0
    while common < min(len(target), len(package)) and target[common] == package[common]:
        common += 1
    return "." * (len(package) - common + 1) + ".".join(target[common:])


def _ours(name: str | None) -> bool:
    return name is not None and (name == NAMESPACE or name.startswith(NAMESPACE + "."))


def _names_used(tree: ast.AST) -> set[str]:
    """Every name a module binds or reads (for picking an alias that shadows nothing)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.alias):
            out.add((n.asname or n.name).split(".")[0])
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            out.update(n.names)
    return out


def rewrite(text: str, path: pathlib.Path, root: pathlib.Path) -> tuple[str, int, list[str]]:
    """(new text, statements rewritten, notes on statements left as they were) for one file's source."""
    tree = ast.parse(text, str(path))
    lines = io.StringIO(text).readlines()
    package = package_of(path, root)
    where = path.relative_to(root)

    def char_col(row: int, byte_col: int) -> int:   # ast columns count UTF-8 bytes, tokenize counts characters
        return len(lines[row - 1].encode("utf-8")[:byte_col].decode("utf-8"))

    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    at = {t.start: i for i, t in enumerate(tokens)}
    dotted_name_read = any(isinstance(n, ast.Name) and n.id == NAMESPACE for n in ast.walk(tree))
    used = _names_used(tree)
    edits: list[tuple[tuple[int, int], tuple[int, int], str]] = []   # (start, end, replacement), rows from 1
    notes: list[str] = []

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _ours(node.module):
            i = at[(node.lineno, char_col(node.lineno, node.col_offset))] + 1   # the token after `from`
            first = tokens[i]
            while not (tokens[i + 1].type == tokenize.NAME and tokens[i + 1].string == "import"):
                i += 1
            edits.append((first.start, tokens[i].end, relative(node.module.split("."), package)))
        elif isinstance(node, ast.Import) and any(_ours(a.name) for a in node.names):
            place = f"{where}:{node.lineno}"
            if len(node.names) != 1:
                notes.append(f"{place}: an import of several modules (split it, then run again)")
                continue
            (alias,) = node.names
            parts = alias.name.split(".")
            if len(parts) == 1:
                notes.append(f"{place}: `import {alias.name}` names the namespace package itself")
                continue
            asname = alias.asname
            if asname is None:
                if dotted_name_read:
                    notes.append(f"{place}: `import {alias.name}` with `{NAMESPACE}.` read as a dotted name")
                    continue
                asname = "_" + "_".join(parts[1:])
                if asname in used:
                    notes.append(f"{place}: `import {alias.name}`: the alias {asname} is taken in this file")
                    continue
            new = f"from {relative(parts[:-1], package)} import {parts[-1]} as {asname}"
            start = (node.lineno, char_col(node.lineno, node.col_offset))
            end = (node.end_lineno, char_col(node.end_lineno, node.end_col_offset))
            edits.append((start, end, new))

    for (r0, c0), (r1, c1), new in sorted(edits, reverse=True):
        lines[r0 - 1:r1] = [lines[r0 - 1][:c0] + new + lines[r1 - 1][c1:]]
    return "".join(lines), len(edits), notes


def library_files(root: pathlib.Path, paths: list[pathlib.Path]) -> list[pathlib.Path]:
    out = []
    for p in paths:
        p = p.resolve()
        if p.is_dir():
            out += [f for f in p.rglob("*.py") if "__pycache__" not in f.parts]
        elif p.suffix == ".py":
            out.append(p)
        else:
            raise SystemExit(f"relative_imports: PATH {p} is neither a folder nor a .py file")
    for f in out:
        rel = f.relative_to(root) if f.is_relative_to(root) else None
        if rel is None or rel.parts[0] not in LIBRARY:
            raise SystemExit(f"relative_imports: PATH {f} is not under a library folder of {root} ({', '.join(LIBRARY)})")
    return sorted(set(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("paths", nargs="*", type=pathlib.Path,
                    help="files or folders under the library folders (default: " + ", ".join(LIBRARY) + ")")
    ap.add_argument("--root", type=pathlib.Path, default=ROOT, help="the checkout (default: %(default)s)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file would change")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    files = library_files(root, args.paths or [root / d for d in LIBRARY if (root / d).is_dir()])
    changed, statements, changed_lines, notes, writes = [], 0, 0, [], []
    for f in files:
        raw = f.read_bytes()
        text = raw.decode("utf-8")
        try:
            new, n, left = rewrite(text, f, root)
        except SyntaxError as e:   # e.g. merge conflict markers: nothing is written (files are written at the end)
            raise SystemExit(f"relative_imports: {f.relative_to(root)}:{e.lineno}: not Python ({e.msg}); fix it first")
        notes += left
        if new != text:
            before, after = text.splitlines(), new.splitlines()
            changed_lines += sum(a != b for a, b in zip(before, after)) + abs(len(before) - len(after))
            changed.append((f.relative_to(root), n))
            statements += n
            writes.append((f, new))
    if not args.check:
        for f, new in writes:
            f.write_bytes(new.encode("utf-8"))
    verb = "would change" if args.check else "changed"
    for rel, n in changed:
        print(f"  {rel}: {n} import statement(s)")
    print(f"relative_imports: {len(files)} files read, {len(changed)} {verb}, {statements} import statements "
          f"rewritten ({changed_lines} lines), {len(notes)} left as they were")
    for note in notes:
        print(f"  left: {note}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
