"""The house's size rules (issue 31): every tracked Python module under spec/, reference/, accelerated/, conformance/
and tools/ (tools/dev/ excluded: development probes, not shipped) is at most 500 lines, and every function or method in
it at most 80 lines (from its `def` line to its last line, as ast counts them; a nested function counts on its own and
inside its parent).

The kernel sources (every tracked file under accelerated/kernels/csrc/: .h, .cuh, .metal) follow the same limits. A
csrc file is either a header (device functions and macros) or a fragment of a kernel function's body (loader.py:
MLX writes the signature, the file is statements spliced in at an #include line), so a "function" there is:
- a function definition: at brace depth 0 of the file (comments, strings and preprocessor lines set aside), a
  `{` whose statement reads `[template <...>] <type and qualifiers> name[<...>](<parameters>) [const]`, name not a
  keyword (if, for, while, switch, ...); it counts from the first line of that statement to its closing `}`;
- the file's top-level body: every line of the file outside those definitions (statements, preprocessor lines,
  comments, blank lines) counted as one body, `<path>::<body>`: a fragment is one piece of a kernel's body, so a
  long fragment is a long function. A `}` without its `{` (rows_end.h closes rows.h's loop) leaves depth 0 alone.
Overloads are told apart as name, name#2, ...

ALLOWED lists the remaining exceptions, each with its reason; an entry that no longer exceeds its limit fails too, so
the list only shrinks.
"""
from __future__ import annotations

import ast
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
ROOMS = ("spec/", "reference/", "accelerated/", "conformance/", "tools/")
EXCLUDED = ("tools/dev/",)
CSRC = "accelerated/kernels/csrc/"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80

# {path or path::qualified.function: reason} for what is still over its limit
ALLOWED: dict[str, str] = {}


def _tracked(*patterns: str) -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return out.split()


def tracked_modules() -> list[str]:
    return [f for f in _tracked("*.py") if f.startswith(ROOMS) and not f.startswith(EXCLUDED)]


def tracked_kernel_sources() -> list[str]:
    return _tracked(CSRC)


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


_KEYWORDS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "constexpr", "else", "do"}
_SIGNATURE = re.compile(r"^(?:template\s*<[^{};]*>\s*)?(?:[\w:<>,*&]+\s+|[*&]\s*)+(\w+)(?:<[^()]*>)?\s*"
                        r"\((?:[^()]|\([^()]*\))*\)\s*(?:const\s*)?$", re.S)


def _code_only(source: str) -> str:
    """`source` with comments, string and character literals and preprocessor lines (with their continuations)
    blanked to spaces, newlines kept, so positions and line numbers still match."""
    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    code = re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', blank, source, flags=re.S)
    return re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", blank, code, flags=re.M)


def _kernel_functions(source: str):
    """(name, lines) of each function definition at brace depth 0 of a csrc file, then ("<body>", lines) for the
    rest of the file (the module docstring says how a function is found)."""
    code = _code_only(source)
    depth, stmt, found, inside, open_ = 0, 0, [], set(), None
    for k, ch in enumerate(code):
        if ch in ";" and depth == 0:
            stmt = k + 1
        elif ch == "{":
            if depth == 0:
                m = _SIGNATURE.match(code[stmt:k].strip())
                open_ = (m.group(1), stmt + len(code[stmt:k]) - len(code[stmt:k].lstrip()), k) \
                    if m and m.group(1) not in _KEYWORDS else None
            depth += 1
        elif ch == "}":
            depth = max(depth - 1, 0)
            if depth == 0:
                if open_ is not None:
                    first, last = code.count("\n", 0, open_[1]), code.count("\n", 0, k)
                    found.append((open_[0], last - first + 1))
                    inside.update(range(first, last + 1))
                    open_ = None
                stmt = k + 1
    seen: dict[str, int] = {}
    for name, n in found:
        seen[name] = seen.get(name, 0) + 1
        yield (name if seen[name] == 1 else f"{name}#{seen[name]}"), n
    rest = len(source.splitlines()) - len(inside)
    if rest:
        yield "<body>", rest


def oversized_kernel_source(path: str, source: str) -> dict[str, int]:
    """{path or path::function: lines} of what in this csrc file is over its limit."""
    over = {}
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        over[path] = lines
    for name, n in _kernel_functions(source):
        if n > MAX_FUNCTION_LINES:
            over[f"{path}::{name}"] = n
    return over


def test_modules_and_functions_stay_small():
    found = {}
    for path in tracked_modules():
        found.update(oversized(path, (ROOT / path).read_text()))
    for path in tracked_kernel_sources():
        found.update(oversized_kernel_source(path, (ROOT / path).read_text()))
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


def test_the_kernel_check_sees_functions_and_fragment_bodies():
    stmts = "".join(f"  x{i} = {i};\n" for i in range(MAX_FUNCTION_LINES - 3))
    fn = f"template <int D>\nVQ_INLINE void vq_f(TGMEM float* a, int n) {{\n{stmts}}}\n"
    assert dict(_kernel_functions(fn)) == {"vq_f": MAX_FUNCTION_LINES}
    long_fn = fn.replace("{\n", "{\n  // one more line\n", 1)
    src = "// helpers\n#define VQ_X(a) { a; }\n" + long_fn + "inline float vq_g(float a) { return a; }\n"
    assert oversized_kernel_source("k.h", src) == {"k.h::vq_f": MAX_FUNCTION_LINES + 1}
    assert dict(_kernel_functions(src))["<body>"] == 2          # the comment and the #define line
    # a fragment: statements, a control block and a `}` closing a loop opened elsewhere (rows_end.h) are one body
    frag = "  x = 0;\n  if (M == 1) {\n" + stmts + "  }\n  }\n"
    assert oversized_kernel_source("f.h", frag) == {"f.h::<body>": MAX_FUNCTION_LINES + 1}
    shorter = "".join(stmts.splitlines(True)[1:])
    assert oversized_kernel_source("f.h", frag.replace(stmts, shorter)) == {}
    assert oversized_kernel_source("big.h", "  x = 1;\n" * (MAX_MODULE_LINES + 1)) == \
        {"big.h": MAX_MODULE_LINES + 1, "big.h::<body>": MAX_MODULE_LINES + 1}
    overloads = "inline int vq_m(int a) { return a; }\ninline float vq_m(float a) { return a; }\n" \
        "template <> inline float vq_m<float>(float a) { return a; }\n"
    assert [n for n, _ in _kernel_functions(overloads)] == ["vq_m", "vq_m#2", "vq_m#3"]


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
