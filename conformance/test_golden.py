"""Golden vectors (golden/, produced by tools/golden/ from the reference; read with golden_format): every case replayed through
the implementation, exact. Error cases must raise ValueError naming the argument."""
from __future__ import annotations

import pytest

from . import checks, golden_format as golden
from .conftest import selected_methods


def _cases(config):
    try:
        cases = list(golden.iter_cases())
    except (OSError, ValueError, KeyError) as e:   # no golden/, or a damaged manifest
        return None, f"golden vectors not readable at {golden.ROOT}: {type(e).__name__}: {e}"
    methods = set(selected_methods(config))
    return [c for c in cases if c.method in methods], None


def pytest_generate_tests(metafunc):
    if "case" not in metafunc.fixturenames:
        return
    cases, reason = _cases(metafunc.config)
    if not cases:   # a failure, never a skip: a missing golden/ must not read as a green run
        metafunc.parametrize("case", [pytest.param(reason or "no golden case for the selected methods")],
                             ids=["golden-missing"])
        return
    metafunc.parametrize("case", cases, ids=[c.id for c in cases])


def test_golden(impl, methods_ok, tally, case, record_property):
    if isinstance(case, str):
        pytest.fail(case, pytrace=False)
    methods_ok(case.method)
    record_property("method", case.method)
    record_property("bits", case.params.resolved().bits if case.kind != "error" else "error")
    record_property("dtype", case.dtype)
    tally.case()
    checks.check_golden(impl, case)


def _cast_vectors():
    try:
        return golden.iter_vectors("cast")["cast"]
    except (OSError, KeyError, ValueError) as e:
        return [f"golden cast vectors not readable: {type(e).__name__}: {e}"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_golden_cast(impl, tally, dtype, record_property):
    """cases/cast.toml (spec 1.2): the cast of decoded binary32 values to the model dtype is RNE with
    overflow to ±Inf (number-model.md 'Outputs'); every vector bit for bit."""
    record_property("dtype", dtype)
    checks.check_golden_cast(impl, _cast_vectors(), dtype)
    tally.case(len(_cast_vectors()))
