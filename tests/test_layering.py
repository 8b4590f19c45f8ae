"""The arrows between layers (DEVELOPERS.md): spec -> reference -> golden; spec -> accelerated; conformance
compares; tools on top. Checked on the source (every import statement, module level or inside a function):
accelerated never imports reference, conformance never imports tools, and so on; tools/ has no import cycle."""
from __future__ import annotations

import ast
import pathlib
import re

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


# ---- kernel sources live in accelerated/kernels/csrc -------------------------------------------------------------
CSRC = ROOT / "accelerated" / "kernels" / "csrc"
# what only kernel text contains (CUDA / Metal / the bodies' own macros), and a preprocessor line
_KERNEL_MARK = re.compile(r"__global__|__device__|__shared__|__syncthreads|\[\[kernel\]\]|\bthreadgroup\b|\bSHARED\("
                          r"|\bBARRIER\(|\basm\s*\(|\bSHFL\w*\(|^\s*#\s*(?:include|define|undef|if|ifdef|ifndef|else|"
                          r"endif|pragma)\b", re.M)
_DIRECTIVE = re.compile(r"^\s*#\s*(?:define|undef|include)\b")
_STATEMENT = re.compile(r"[;{]\s*$", re.M)


def _literals(path: pathlib.Path):
    """(line, text) of every string literal of a module but its docstrings; an f-string's fields read as {}."""
    tree = ast.parse(path.read_text(), str(path))
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def kernel_literals(path: pathlib.Path) -> list[str]:
    """String literals of a module that are kernel source: several lines with kernel marks or C statements, or one
    line with a kernel mark that is not a preprocessor definition (a loader's generated `#define NAME value`,
    `#undef`, `#include` lines are allowed, one per literal)."""
    bad = []
    for line, text in _literals(path):
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) > 1:
            if _KERNEL_MARK.search(text) or len(_STATEMENT.findall(text)) >= 2:
                bad.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}: {lines[0][:60]!r}")
        elif lines and _KERNEL_MARK.search(lines[0]) and not _DIRECTIVE.match(lines[0]):
            bad.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}: {lines[0][:60]!r}")
    return bad


def test_kernel_sources_only_under_csrc():
    """No kernel text in Python string literals under accelerated/: it lives in files under accelerated/kernels/csrc
    (composed by accelerated/kernels/loader.py), each at most 500 lines."""
    bad = [b for f in _files("accelerated") for b in kernel_literals(f)]
    assert not bad, "kernel text in Python strings (move it to accelerated/kernels/csrc):\n" + "\n".join(bad)
    sources = sorted(p for p in CSRC.iterdir() if p.suffix in (".h", ".cuh", ".metal"))
    assert sources and sorted(p.name for p in CSRC.iterdir()) == [p.name for p in sources], "csrc: sources only"
    long = [f"{p.name}: {n}" for p in sources if (n := len(p.read_text().splitlines())) > 500]
    assert not long, long


def test_kernel_literal_checker_sees_kernel_text(tmp_path):
    """The check itself can fail: a body, a one-line statement and a prelude in a literal are seen; generated
    #define lines, a docstring and prose are not."""
    f = tmp_path / "probe.py"
    f.write_text('"""A module about __syncthreads() and SHARED(...) arrays;\nthe docstring may say so."""\n'
                 'BODY = """\n  SHARED(float, f_t, 32);\n  BARRIER();\n"""\n'
                 'LINE = "  BARRIER();\\n"\n'
                 'PRELUDE = "#define TID threadIdx.x\\n#define BARRIER() __syncthreads()\\n"\n'
                 'OK = [f"#define {1} {2}\\n", "#undef GROUP\\n", "an error; with a semicolon"]\n')
    bad = kernel_literals(f)
    assert [b.split(":")[1] for b in bad] == ["3", "7", "8"], bad


# ---- tuning knobs: one frozen object (accelerated/tuning.py), no module globals ----------------------------------
TUNING = ROOT / "accelerated" / "tuning.py"


def tuning_knobs() -> set[str]:
    """The field names of accelerated.tuning.Tuning, read from the source (no import)."""
    tree = ast.parse(TUNING.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Tuning"]
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _knob(name: str, knobs: set[str]) -> bool:
    """A name that spells a knob as a constant would: FUSE_APPEND, _COMPACT_ROWS, fuse_append."""
    return name.lstrip("_").lower() in knobs


def _module_statements(body):
    """Statements run at import time (into if / try / with blocks, not into functions or classes)."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for part in ("body", "orelse", "finalbody"):
                yield from _module_statements(getattr(node, part, []))
            for h in getattr(node, "handlers", []):
                yield from _module_statements(h.body)


def tuning_globals(path: pathlib.Path, knobs: set[str]) -> list[str]:
    """Module-level names of a file that spell a tuning knob (a knob kept as a mutable module global)."""
    bad = []
    for node in _module_statements(ast.parse(path.read_text(), str(path)).body):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name) and _knob(n.id, knobs):
                    bad.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}: {n.id}")
    return bad


def knob_patches(path: pathlib.Path, knobs: set[str]) -> list[str]:
    """Places that set a knob on a module instead of through tuning.override: setattr / monkeypatch.setattr with a
    knob's name (or a computed name: the old string -> module tables), `module.KNOB = ...` assignments."""
    bad = []
    where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name != "setattr" or not node.args:
                continue
            a = node.args
            if len(a) >= 2 and not isinstance(a[1], ast.Constant):
                bad.append(f"{where}:{node.lineno}: setattr with a computed name")
            for c in a[:2]:
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and _knob(c.value.rsplit(".")[-1], knobs):
                    bad.append(f"{where}:{node.lineno}: setattr of {c.value}")
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(t, ast.Attribute) and t.attr != t.attr.lower() and _knob(t.attr, knobs):
                    bad.append(f"{where}:{node.lineno}: assignment to .{t.attr}")
    return bad


def test_no_tuning_knob_outside_the_tuning_object():
    """Every tuning knob is a field of accelerated.tuning.Tuning, read through tuning.current() when a launch is
    planned: no module global of accelerated/ spells one, and tests/ and tools/ change knobs only through
    tuning.override (or the tests' `tune` fixture), never by setting module attributes."""
    knobs = tuning_knobs()
    assert len(knobs) >= 13, knobs
    bad = [b for f in _files("accelerated") if f != TUNING for b in tuning_globals(f, knobs)]
    assert not bad, "tuning knobs as module globals (make them fields of accelerated/tuning.py's Tuning):\n" + \
        "\n".join(bad)
    files = [p for d in ("tests", "tools") for p in sorted((ROOT / d).rglob("*.py"))]
    bad = [b for f in files for b in knob_patches(f, knobs)]
    assert not bad, "knobs set on modules (use accelerated.tuning.override):\n" + "\n".join(bad)


def test_tuning_checkers_see_a_reintroduced_knob(tmp_path):
    """The checks themselves can fail: a knob as a module global (plain, private, annotated, inside an if) and the
    ways tests and tools used to flip one are seen; a local variable, a lowercase attribute and other constants
    are not."""
    knobs = tuning_knobs()
    f = tmp_path / "probe.py"
    f.write_text("FUSE_APPEND = True\n_COMPACT_ROWS: int = 256\nif True:\n    TC_CODES = False\n"
                 "NT = 128\nTABLE = 256\n\ndef f():\n    SHARED = 1\n    return SHARED\n")
    assert [b.split(": ")[-1] for b in tuning_globals(f, knobs)] == ["FUSE_APPEND", "_COMPACT_ROWS", "TC_CODES"]
    g = tmp_path / "probe_test.py"
    g.write_text("def test(monkeypatch, m, k):\n"
                 "    monkeypatch.setattr(katt, 'FUSE_APPEND', False)\n"
                 "    monkeypatch.setattr('veloxquant.accelerated.cache.batch.SPLIT_ROWS', False)\n"
                 "    setattr(m, k, 1)\n"
                 "    batch_shared.SHARED = False\n"
                 "    monkeypatch.setattr(katt, '_sm_count', lambda: 4)\n"
                 "    self.shared = True\n")
    assert sorted(int(b.split(":")[1]) for b in knob_patches(g, knobs)) == [2, 3, 4, 5], knob_patches(g, knobs)
