"""The house's size rules (issue 31): every tracked Python module under spec/, reference/, accelerated/, conformance/
and tools/ (tools/dev/ excluded: development probes, not shipped) is at most 500 lines, and every function or method in
it at most 80 lines (from its `def` line to its last line, as ast counts them; a nested function counts on its own and
inside its parent).

Scope: Python only. The kernel sources under accelerated/kernels/csrc/ are C++ and out of this check's scope.

ALLOWED lists the remaining exceptions, each with its reason; an entry that no longer exceeds its limit fails too, so
the list only shrinks.
"""
from __future__ import annotations

import ast
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
ROOMS = ("spec/", "reference/", "accelerated/", "conformance/", "tools/")
EXCLUDED = ("tools/dev/",)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80

# {path or path::qualified.function: reason} for what is still over its limit
ALLOWED: dict[str, str] = {}


def tracked_modules() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked modules are unknown")
    return [f for f in out.split() if f.startswith(ROOMS) and not f.startswith(EXCLUDED)]


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                yield name, node.end_lineno - node.lineno + 1
            yield from _functions(node, name + ".")
        else:
            yield from _functions(node, prefix)


def oversized(path: str, source: str) -> dict[str, int]:
    """{path or path::function: lines} of what in this module is over its limit."""
    over = {}
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        over[path] = lines
    for name, n in _functions(ast.parse(source, path)):
        if n > MAX_FUNCTION_LINES:
            over[f"{path}::{name}"] = n
    return over


def test_modules_and_functions_stay_small():
    found = {}
    for path in tracked_modules():
        found.update(oversized(path, (ROOT / path).read_text()))
    new = {k: n for k, n in found.items() if k not in ALLOWED}
    limits = f"(modules <= {MAX_MODULE_LINES} lines, functions <= {MAX_FUNCTION_LINES})"
    assert not new, f"over the size limits {limits}; split them, or list them in ALLOWED with a reason:\n" + \
        "\n".join(f"  {k}: {n} lines" for k, n in sorted(new.items()))
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"ALLOWED entries now within the limits {limits}; remove them: {stale}"


def test_the_check_sees_methods_and_nested_functions():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    src = f"class C:\n    def m(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n\n\ndef ok():\n    return 1\n"
    assert oversized("m.py", src) == {"m.py::C.m": MAX_FUNCTION_LINES + 1}
    nested = f"def outer():\n    def inner():\n    {body.replace(chr(10), chr(10) + '    ')}\n    return inner\n"
    assert set(oversized("n.py", nested)) == {"n.py::outer", "n.py::outer.inner"}
    assert oversized("big.py", "x = 1\n" * (MAX_MODULE_LINES + 1)) == {"big.py": MAX_MODULE_LINES + 1}
    assert oversized("fine.py", "x = 1\n" * MAX_MODULE_LINES) == {}


LEFTOVERS = ("*.orig", "*.rej", "*.bak", "*.swp", "*~")


def test_no_merge_or_editor_leftovers_are_tracked():
    """A conflict resolution's `*.orig` / `*.rej` or an editor's backup committed by mistake would ship as dead code
    beside the real module (one accelerated/in_place.py.orig did)."""
    try:
        left = subprocess.run(["git", "ls-files", *LEFTOVERS], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    assert not left, f"tracked leftovers of a merge or an editor: {left}; git rm them"
