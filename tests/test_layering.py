"""The arrows between layers (DEVELOPERS.md): spec -> reference -> golden; spec -> accelerated; conformance
compares; tools on top. Checked on the source (every import statement, module level or inside a function):
accelerated never imports reference, conformance never imports tools, and so on; tools/ and accelerated/ have no
import cycle, accelerated/'s modules import each other at module level only, and tools/' shipped rooms never import
tools/dev/ (left out of the wheel)."""
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


def _absolute(mod: str, node: ast.ImportFrom, path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
    """The module a `from` statement names; a relative one is resolved from the file's folder under `root`, which is
    the namespace package (`from ... import spec` in accelerated/cache/base.py names veloxquant.spec)."""
    if not node.level:
        return mod
    pkg = [NAMESPACE.rstrip("."), *path.relative_to(root).parts[:-1]]
    base = pkg[:max(0, len(pkg) - node.level + 1)]
    return ".".join(base + ([mod] if mod else []))


def imports(path: pathlib.Path, root: pathlib.Path = ROOT) -> set[str]:
    """Absolute module names imported by a file (relative imports resolved; the namespace prefix dropped)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module or "", node, path, root)
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


def _module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def tools_graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    """tools module -> the tools modules it imports. `from pkg import sub` is an arrow to pkg.sub alone: the
    package's __init__ runs first, but importing a sibling through its package is not depending on the package."""
    files = {_module_name(f, root): f for f in sorted((root / "tools").rglob("*.py"))}
    graph = {}
    for m, f in files.items():
        names = imports(f, root)
        graph[m] = {n for n in names if n in files and not any(s.startswith(n + ".") and s in files for s in names)}
        graph[m].discard(m)
    return graph


def test_tools_have_no_import_cycle():
    graph = tools_graph()
    assert len(graph) > 40 and "tools.bench.arms" in graph, sorted(graph)   # the rooms are seen, not only tools/*.py
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_shipped_tools_never_import_dev():
    """tools/dev/ is left out of the wheel, so a shipped room that imported it would fail once installed."""
    bad = [f"{m} imports {n}" for m, deps in tools_graph().items() if not m.startswith("tools.dev")
           for n in deps if n.startswith("tools.dev")]
    assert not bad, "\n".join(bad)


def test_wheel_ships_every_tools_room_but_dev():
    """pyproject.toml's package list names every sub-package of tools/ except dev (a room left out would be
    missing from the installed command; dev listed would ship the development probes)."""
    import sys
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    rooms = {"veloxquant." + _module_name(f) for f in (ROOT / "tools").rglob("__init__.py")}
    assert rooms - {"veloxquant.tools.dev"} <= listed, sorted(rooms - listed - {"veloxquant.tools.dev"})
    assert "veloxquant.tools.dev" not in listed


def test_cycle_checker_sees_a_cycle(tmp_path):
    """The check itself can fail: a cycle through a sibling imported via its package is found."""
    (tmp_path / "tools" / "room").mkdir(parents=True)
    (tmp_path / "tools" / "__init__.py").write_text("")
    (tmp_path / "tools" / "room" / "__init__.py").write_text("")
    (tmp_path / "tools" / "room" / "a.py").write_text("from veloxquant.tools.room import b\n")
    (tmp_path / "tools" / "room" / "b.py").write_text("def f():\n    from . import a\n")
    assert find_cycle(tools_graph(tmp_path)) == ["tools.room.a", "tools.room.b", "tools.room.a"]


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


# ---- `veloxquant.X` is an ordinary package in a checkout -----------------------------------------------------------
PACKAGE_LAYERS = ("veloxquant", "spec", "reference", "accelerated", "conformance", "tools")


def _package_dirs() -> dict[str, str]:
    """pyproject.toml's package-dir: the subpackage's last name -> its top-level folder (veloxquant itself left out)."""
    import tomllib
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {k.split(".", 1)[1]: v for k, v in dirs.items() if "." in k}


def import_machinery(path: pathlib.Path) -> list[str]:
    """Places where a module changes how imports resolve: sys.meta_path / sys.path_hooks, an import finder or
    loader class, a package __path__ changed, or sys.modules written (an alias); reading sys.modules is fine."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    bad = []

    sys_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
                 if a.name == "sys"}   # `import sys as _sys` too

    def dotted(node) -> str:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            parts.append("sys" if node.id in sys_names else node.id)
        return ".".join(reversed(parts))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and dotted(node) in ("sys.meta_path", "sys.path_hooks"):
            bad.append(f"{where}:{node.lineno}: {dotted(node)}")
        elif isinstance(node, ast.ClassDef):
            finders = [dotted(b) for b in node.bases if re.search(r"(Finder|Loader)$", dotted(b))]
            if finders:
                bad.append(f"{where}:{node.lineno}: class {node.name}({', '.join(finders)})")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                name = dotted(t.value) if isinstance(t, ast.Subscript) else dotted(t)
                if name in ("__path__", "sys.modules") or name.endswith(".__path__"):
                    bad.append(f"{where}:{node.lineno}: {name} assigned")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = dotted(node.func.value)
            if (owner == "__path__" or owner.endswith(".__path__")
                    or (owner == "sys.modules" and node.func.attr in ("update", "setdefault"))):
                bad.append(f"{where}:{node.lineno}: {owner}.{node.func.attr}()")
    return bad


def test_no_import_machinery_in_the_package():
    """Every `veloxquant.X` import resolves the ordinary way, so static tools (import graph, IDE, type checker) follow
    it: no custom finder or loader, no __path__ extended at run time, no module swapped in sys.modules."""
    bad = [b for layer in PACKAGE_LAYERS for f in _files(layer) for b in import_machinery(f)]
    assert not bad, "import machinery in the package (use the veloxquant/X symlinks instead):\n" + "\n".join(bad)


def test_import_machinery_checker_sees_finders_and_aliases(tmp_path):
    """The check itself can fail: the finder, the __path__ extension and the sys.modules swap that the package
    once used are each seen; reading sys.modules is not."""
    f = tmp_path / "probe.py"
    f.write_text("import importlib.abc, sys as _sys\n"
                 "__path__.append('/checkout')\n"
                 "class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):\n    pass\n"
                 "_sys.meta_path.insert(0, _Alias())\n"
                 "_sys.modules[__name__] = object()\n"
                 "me = _sys.modules[__name__]\n")
    assert sorted(int(b.split(":")[1]) for b in import_machinery(f)) == [2, 3, 5, 6], import_machinery(f)


def test_checkout_links_every_subpackage():
    """veloxquant/ holds __init__.py and one relative symlink per package-dir entry (veloxquant/spec -> ../spec, ...):
    the checkout's import path is the installed one."""
    here = ROOT / "veloxquant"
    want = _package_dirs()
    links = {p.name: p for p in here.iterdir() if p.is_symlink()}
    assert sorted(links) == sorted(want), f"veloxquant/ symlinks {sorted(links)} != package-dir {sorted(want)}"
    for name, folder in want.items():
        target = links[name].readlink()
        assert not target.is_absolute() and links[name].resolve() == (ROOT / folder).resolve(), \
            f"veloxquant/{name} -> {target}: want ../{folder}"
    others = sorted(p.name for p in here.iterdir() if not p.is_symlink() and p.name not in ("__init__.py", "__pycache__"))
    assert not others, f"veloxquant/ holds more than the links and __init__.py: {others}"


# ---- accelerated/ has no import cycle, and no function-level import stands in for a module-level one -------------
def import_edges(path: pathlib.Path, modules, me: str | None = None) -> list[tuple[str, int, bool]]:
    """(module, line, inside a function) for every import statement of the file of module `me` (by default its
    name under ROOT) that names a module of `modules` (a set of dotted names without the namespace prefix). `from P import n` names P.n where that is a module, else P;
    importing P.Q also runs P's __init__, so P is named too unless P is a package of the importing file itself
    (already running when the file runs)."""
    me = me or _module_name(path)
    mine = {".".join(me.split(".")[:i]) for i in range(1, me.count(".") + 1)} | {me}
    if path.name == "__init__.py":
        mine.discard(me)     # a package's __init__ importing a submodule is an arrow (not the other way)
    out = []

    def named(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = _absolute(node.module or "", node, path)
        base = base[len(NAMESPACE):] if base.startswith(NAMESPACE) else base
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]

    def walk(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for name in named(child):
                    name = name[len(NAMESPACE):] if name.startswith(NAMESPACE) else name
                    parts = name.split(".")
                    targets = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
                    explicit = targets[-1]
                    for t in targets:
                        edge = (t, child.lineno, inside)
                        if t in modules and t != me and (t == explicit or t not in mine) and edge not in out:
                            out.append(edge)
            walk(child, inside)

    walk(ast.parse(path.read_text(), str(path)), False)
    return out


def _accelerated_graph():
    files = {_module_name(f): f for f in _files("accelerated")}
    return files, {m: import_edges(f, set(files)) for m, f in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (module -> modules it imports) as a path that ends where it starts, or None."""
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n, stack + [n])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m, [m])):
            return found
    return None


def all_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per group of modules that import each other (removing one found cycle's last arrow at a time)."""
    graph = {m: set(ns) for m, ns in graph.items()}
    found = []
    while (c := find_cycle(graph)) and len(found) < 50:
        found.append(c)
        graph[c[-2]].discard(c[-1])
    return found


def test_accelerated_has_no_import_cycle():
    """Every import statement of accelerated/, module level or inside a function, is an arrow; no arrow path comes
    back to where it started (a function-level import does not make a cycle go away, it only hides it)."""
    _, edges = _accelerated_graph()
    cycles = all_cycles({m: {t for t, _, _ in es} for m, es in edges.items()})
    assert not cycles, "import cycles in accelerated/:\n" + "\n".join(" -> ".join(c) for c in cycles)


# A function-level import of another accelerated module is allowed only here, with the reason (module -> imported).
FUNCTION_LEVEL_ALLOWED: dict[tuple[str, str], str] = {}


def test_no_function_level_import_inside_accelerated():
    """Modules of accelerated/ import each other at module level, so the import graph shows every arrow where a
    reader looks for it; imports of outside packages (mlx_lm.generate, numpy) inside functions are not counted."""
    files, edges = _accelerated_graph()
    bad = [f"{files[m].relative_to(ROOT)}:{line}: imports {t} inside a function"
           for m, es in sorted(edges.items()) for t, line, inside in es
           if inside and (m, t) not in FUNCTION_LEVEL_ALLOWED]
    assert not bad, "function-level imports of accelerated modules:\n" + "\n".join(bad)


def test_cycle_checker_sees_function_level_cycles(tmp_path):
    """The check itself can fail: a cycle closed by an import inside a function is found, with its path; a package
    importing its submodule, which imports a sibling through the package, is not a cycle."""
    files = {"a": "def f():\n    from veloxquant.pkg import b\n",
             "b": "from veloxquant.pkg.c import X\n",
             "c": "import veloxquant.pkg.a\n",
             "__init__": "from veloxquant.pkg import a\n",
             "d": "from veloxquant.pkg import c\n"}
    (tmp_path / "pkg").mkdir()
    for name, text in files.items():
        (tmp_path / "pkg" / f"{name}.py").write_text(text)
    mods = {"pkg"} | {f"pkg.{n}" for n in files if n != "__init__"}
    graph = {}
    for name in files:
        me = "pkg" if name == "__init__" else f"pkg.{name}"
        path = tmp_path / "pkg" / f"{name}.py"
        edges = import_edges(path, mods, me)
        graph[me] = {t for t, _, _ in edges}
        if name == "a":
            assert edges == [("pkg.b", 2, True)], edges
    assert graph["pkg.d"] == {"pkg.c"} and graph["pkg"] == {"pkg.a"}, graph
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    graph["pkg.c"] = set()
    assert find_cycle(graph) is None


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


# ---- the library imports itself relatively (tools/dev/relative_imports.py rewrites absolute ones) ---------------
def absolute_self_imports(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Import statements of a library file that name the library through the `veloxquant.` namespace (a static tool
    that does not follow the veloxquant/ symlinks sees them as imports of nothing in the tree), and relative ones
    whose module is no file or folder of the checkout (a dot too many or too few)."""
    where = path.relative_to(root)
    ns = NAMESPACE.rstrip(".")
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name == ns or a.name.startswith(NAMESPACE)]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module] if node.module == ns or node.module.startswith(NAMESPACE) else []
        elif isinstance(node, ast.ImportFrom):
            mod = _absolute(node.module or "", node, path, root)
            parts = mod.split(".")[1:]
            target = root.joinpath(*parts)
            if mod != ns and not mod.startswith(NAMESPACE):
                bad.append(f"{where}:{node.lineno}: {'.' * node.level}{node.module or ''} goes past the checkout")
            elif parts and not (target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()):
                bad.append(f"{where}:{node.lineno}: {'.' * node.level}{node.module or ''} is no module of {root}")
            continue
        else:
            continue
        bad += [f"{where}:{node.lineno}: {n} imported absolutely" for n in names]
    return bad


def test_library_imports_itself_relatively():
    """Every import of a library module by another is relative (`from ..kernels import x`): the same module at run
    time, and the file's real neighbour for a static import-graph tool, an IDE or a type checker. Rewrite with
    `python tools/dev/relative_imports.py`; importlib strings are not imports and stay as they are."""
    bad = [b for layer in LAYERS for f in _files(layer) for b in absolute_self_imports(f)]
    assert not bad, "absolute imports of the library (run python tools/dev/relative_imports.py):\n" + "\n".join(bad)


def test_relative_import_checker_sees_absolute_ones(tmp_path):
    """The check itself can fail: module-level, function-level, aliased, multi-line and bare absolute imports and a
    relative import past the checkout are seen; a good relative import and an importlib string are not."""
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "__init__.py").write_text("")
    (tmp_path / "pkg").mkdir()
    f = tmp_path / "pkg" / "probe.py"
    f.write_text("import importlib\n"
                 "from veloxquant import spec\n"
                 "from veloxquant.spec.params import (\n    Params,\n)\n"
                 "import veloxquant.spec as s\n"
                 "def g():\n    import veloxquant.reference.stream\n"
                 "    return importlib.import_module('veloxquant.spec')\n"
                 "from .. import spec as ok\n"
                 "from ..nothing import x\n"
                 "from ... import spec\n")
    got = absolute_self_imports(f, tmp_path)
    assert sorted(int(b.split(":")[1]) for b in got) == [2, 3, 6, 8, 11, 12], got


def outside_namespace_imports(path: pathlib.Path) -> list[str]:
    """Imports of a library folder by its bare name (`from conformance.checks import x`): a second copy of the module
    outside the namespace, whose relative imports cannot reach its siblings."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else []
        bad += [f"{path.name}:{node.lineno}: {n}" for n in names if n.split(".")[0] in PACKAGE_LAYERS[1:] + ("golden",)]
    return bad


def test_tests_import_the_library_through_the_namespace():
    """tests/ and benchmarks/ import the library as veloxquant.X (tests/ is on sys.path, and the checkout root too
    under PYTHONPATH, so `import conformance.x` would load a copy that breaks on its first relative import)."""
    files = [p for d in ("tests", "benchmarks") for p in sorted((ROOT / d).rglob("*.py"))]
    bad = [b for f in files for b in outside_namespace_imports(f)]
    assert not bad, "library imported outside the veloxquant namespace:\n" + "\n".join(bad)


def test_outside_namespace_checker_sees_a_bare_layer(tmp_path):
    """The check itself can fail: a bare layer import is seen; the namespaced one and tests' own helpers are not."""
    f = tmp_path / "probe.py"
    f.write_text("import _faults\nfrom veloxquant.conformance import checks\n"
                 "def t():\n    from conformance.attention_checks import attention_f64\n    import tools.cli\n")
    assert sorted(int(b.split(":")[1]) for b in outside_namespace_imports(f)) == [4, 5], outside_namespace_imports(f)
