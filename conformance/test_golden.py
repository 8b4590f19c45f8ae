"""Golden vectors (golden/, produced by tools/golden.py from the reference): every case replayed through
the implementation, exact. Error cases must raise ValueError naming the argument."""
from __future__ import annotations

import pytest

from . import checks
from .conftest import selected_methods


def _cases(config):
    try:
        from . import golden_format as golden
        cases = list(golden.iter_cases())
    except (ImportError, AttributeError, FileNotFoundError) as e:
        return None, f"golden vectors not available: {type(e).__name__}: {e}"
    methods = set(selected_methods(config))
    return [c for c in cases if c.method in methods], None


def pytest_generate_tests(metafunc):
    if "case" not in metafunc.fixturenames:
        return
    cases, reason = _cases(metafunc.config)
    if cases is None or not cases:
        metafunc.parametrize("case", [pytest.param(None, marks=pytest.mark.skip(
            reason=reason or "no golden case for the selected methods"))], ids=["no-golden"])
        return
    metafunc.parametrize("case", cases, ids=[c.id for c in cases])


def test_golden(impl, methods_ok, tally, case, record_property):
    methods_ok(case.method)
    record_property("method", case.method)
    record_property("bits", case.params.resolved().bits if case.kind != "error" else "error")
    record_property("dtype", case.dtype)
    tally.case()
    checks.check_golden(impl, case)
