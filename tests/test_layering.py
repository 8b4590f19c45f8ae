"""The arrows between layers (DEVELOPERS.md): spec -> reference -> golden; spec -> accelerated; conformance
compares; tools on top. Checked on the source (every import statement, module level or inside a function):
accelerated never imports reference, conformance never imports tools, and so on; tools/ has no import cycle."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAYERS = ("spec", "reference", "accelerated", "conformance", "tools")
FORBIDDEN = {   # layer -> layers it must never import
    "spec": {"reference", "accelerated", "conformance", "tools"},
    "reference": {"accelerated", "conformance", "tools"},
    "accelerated": {"reference", "conformance", "tools"},
    "conformance": {"tools"},
}
NAMESPACE = "veloxquant."   # the installed distribution's namespace (tools/namespace rename), if applied


def _absolute(mod: str, node: ast.ImportFrom, path: pathlib.Path) -> str:
    if not node.level:
        return mod
    pkg = list(path.relative_to(ROOT).with_suffix("").parts[:-1])
    base = pkg[:len(pkg) - node.level + 1]
    return ".".join(base + ([mod] if mod else []))


def imports(path: pathlib.Path) -> set[str]:
    """Absolute module names imported by a file (relative imports resolved; the namespace prefix dropped)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module or "", node, path)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n[len(NAMESPACE):] if n.startswith(NAMESPACE) else n for n in names}
    return out


def _files(layer: str):
    return sorted((ROOT / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_import_against_the_arrows(layer):
    bad = []
    for f in _files(layer):
        for name in imports(f):
            top = name.split(".")[0]
            if top in FORBIDDEN[layer]:
                bad.append(f"{f.relative_to(ROOT)} imports {name}")
    assert not bad, "\n".join(bad)


def test_checker_sees_a_forbidden_import(tmp_path):
    """The check itself can fail: namespaced, plain and function-level imports are all seen."""
    f = tmp_path / "probe.py"
    f.write_text("def f():\n    from veloxquant.reference import stream\n    import reference.numerics\n")
    found = imports(f)     # reference, reference.stream (the namespace prefix dropped), reference.numerics
    assert sum(n.split(".")[0] == "reference" for n in found) >= 3, found


def test_tools_have_no_import_cycle():
    mods = {f.stem: f for f in _files("tools") if f.parent == ROOT / "tools"}
    graph = {m: {n.split(".")[1] for n in imports(f) if n.startswith("tools.") and n.split(".")[1] in mods}
             for m, f in mods.items()}
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
