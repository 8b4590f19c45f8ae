"""pytest plugin of the source checkout (pyproject addopts `-p checkout_suite`): `pytest conformance ...`
collects the suite through veloxquant/conformance, the package's own path.

pytest names a module after the __init__.py folders above its file as spelled on the command line:
conformance/checks.py would be imported as `conformance.checks`, a second copy beside
`veloxquant.conformance.checks` that tests/ and the adapters import (two Mismatch classes, two conftest
plugins registering --impl). Through veloxquant/conformance (a symlink to ../conformance) the same file is
`veloxquant.conformance.checks`, one module. This rewrites such path arguments before the initial conftests
load; node ids then read veloxquant/conformance/test_x.py::..., and a bare `pytest` gets the same path from
testpaths.
"""
from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SUITE = ROOT / "conformance"
LINKED = ROOT / "veloxquant" / "conformance"


def linked(arg: str, invocation_dir: pathlib.Path) -> str:
    """`arg` (a path, maybe with ::node parts) spelled through veloxquant/conformance when it names the suite
    folder or something in it; any other argument unchanged."""
    path, sep, rest = arg.partition("::")
    full = pathlib.Path(os.path.normpath(invocation_dir / path))
    if full != SUITE and SUITE not in full.parents:
        return arg
    new = LINKED / full.relative_to(SUITE)
    return os.path.relpath(new, invocation_dir) + sep + rest


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config):
    """The paths the initial conftests are looked up from (conformance/conftest.py registers --impl)."""
    ns = early_config.known_args_namespace
    if not ns.pyargs:
        here = early_config.invocation_params.dir
        ns.file_or_dir[:] = [linked(a, here) for a in ns.file_or_dir]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """The paths collected (config.args, decided from the command line after the conftests loaded)."""
    if not config.option.pyargs:
        here = config.invocation_params.dir
        config.args[:] = [linked(a, here) for a in config.args]
