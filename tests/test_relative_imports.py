"""tools/dev/relative_imports.py, the rewriter of the library's absolute imports: what it writes for each kind of
statement, that a second run changes nothing, and what it leaves and lists."""
from __future__ import annotations

import pytest

from veloxquant.tools.dev import relative_imports as ri

SOURCE = '''"""from veloxquant.spec import x stays in a docstring."""
from veloxquant import spec  # the spec
from veloxquant.accelerated.kernels import (
    a,     # first
    b as bee,
)
from veloxquant.accelerated.cache.roles import Role; import veloxquant.spec as _sp
import os, veloxquant.reference as r


def f(stream):
    import veloxquant.reference.stream
    from veloxquant.accelerated.cache import size  # noqa: F401
    return importlib.import_module("veloxquant.accelerated.ops"), "\u00e9", stream
'''
WANT = '''"""from veloxquant.spec import x stays in a docstring."""
from ... import spec  # the spec
from ..kernels import (
    a,     # first
    b as bee,
)
from .roles import Role; from ... import spec as _sp
import os, veloxquant.reference as r


def f(stream):
    from ...reference import stream as _reference_stream
    from . import size  # noqa: F401
    return importlib.import_module("veloxquant.accelerated.ops"), "\u00e9", stream
'''


def test_rewrites_each_kind_of_statement_and_is_idempotent(tmp_path):
    path = tmp_path / "accelerated" / "cache" / "base.py"
    new, n, notes = ri.rewrite(SOURCE, path, tmp_path)
    assert new == WANT
    assert n == 6 and notes == ["accelerated/cache/base.py:8: an import of several modules (split it, then run again)"]
    again, n2, _ = ri.rewrite(new, path, tmp_path)
    assert again == new and n2 == 0


def test_package_init_and_dotted_use(tmp_path):
    """A package's __init__ imports its submodules with one dot; a bare import whose dotted name is read stays."""
    path = tmp_path / "tools" / "golden" / "__init__.py"
    src = "from veloxquant.tools.golden.cases import build\nimport veloxquant.reference.stream\n" \
          "s = veloxquant.reference.stream.Stream\n"
    new, n, notes = ri.rewrite(src, path, tmp_path)
    assert new.splitlines()[:2] == ["from .cases import build", "import veloxquant.reference.stream"] and n == 1
    assert len(notes) == 1 and "read as a dotted name" in notes[0]


def test_main_check_mode(tmp_path, capsys):
    """--check writes nothing and exits 1 while a file would change; the run writes, and the next --check is 0."""
    f = tmp_path / "spec" / "x.py"
    f.parent.mkdir()
    before = "from veloxquant.spec import params\nfrom veloxquant.spec.params import Params\n"
    f.write_text(before)
    assert ri.main(["--root", str(tmp_path), "--check"]) == 1 and f.read_text() == before
    assert ri.main(["--root", str(tmp_path)]) == 0
    assert f.read_text() == "from . import params\nfrom .params import Params\n"
    assert ri.main(["--root", str(tmp_path), "--check"]) == 0
    assert "1 files read, 0 would change" in capsys.readouterr().out


def test_unparsable_file_stops_before_any_write(tmp_path):
    """A file left with merge conflict markers stops the run with its name, and no other file is written."""
    (tmp_path / "tools").mkdir()
    good = tmp_path / "tools" / "a.py"
    good.write_text("from veloxquant import spec\n")
    (tmp_path / "tools" / "b.py").write_text("from veloxquant import spec\n<<<<<<< HEAD\n")
    with pytest.raises(SystemExit, match=r"tools/b.py:2: not Python"):
        ri.main(["--root", str(tmp_path)])
    assert good.read_text() == "from veloxquant import spec\n"


def test_columns_after_non_ascii_text(tmp_path):
    """ast counts UTF-8 bytes, the edit counts characters: statements after non-ASCII text on their line land right."""
    src = 'x = "\u00e9\u00e9"; from veloxquant.tools.cli import main; import veloxquant.spec as s\n'
    new, n, _ = ri.rewrite(src, tmp_path / "tools" / "golden" / "a.py", tmp_path)
    assert new == 'x = "\u00e9\u00e9"; from ..cli import main; from ... import spec as s\n' and n == 2
