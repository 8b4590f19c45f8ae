"""Golden vectors (golden/, produced by tools/golden/ from the reference; read with golden_format): every case replayed through
the implementation, exact. Error cases must raise ValueError naming the argument."""
from __future__ import annotations

import pytest

from . import checks, golden_format as golden
from .conftest import parametrize_golden


def pytest_generate_tests(metafunc):
    parametrize_golden(metafunc, "case", golden.iter_cases, "golden cases", "golden-missing")


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
