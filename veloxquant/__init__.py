"""The `veloxquant` distribution namespace. Installed (a wheel, `pip install .`), its subpackages are the
repository's top-level folders (pyproject.toml package-dir): veloxquant.spec, .reference, .accelerated,
.conformance, .tools, .golden. In a source checkout (the folders next to this one) the same names resolve to
those folders, so `python -m veloxquant.tools.cli` and PYTHONPATH=<checkout> work without installing.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import pathlib
import sys

_CHECKOUT = pathlib.Path(__file__).resolve().parent.parent
_IN_CHECKOUT = (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "spec" / "formats.toml").is_file()
if _IN_CHECKOUT and str(_CHECKOUT) not in __path__:
    __path__.append(str(_CHECKOUT))   # veloxquant.spec -> <checkout>/spec, ...


class _SuiteAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """pytest imports <checkout>/conformance/*.py by path, as `conformance.*`; this makes each such module
    the very object `veloxquant.conformance.*` (one copy of every class, e.g. Implementation, Mismatch)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "conformance" or fullname.startswith("conformance."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(f"veloxquant." + spec.name)

    def exec_module(self, module):
        pass


if _IN_CHECKOUT and not any(isinstance(f, _SuiteAlias) for f in sys.meta_path):
    sys.meta_path.insert(0, _SuiteAlias())
