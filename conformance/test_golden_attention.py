"""Golden attention cases (golden/bulk/attention.npz, spec/attention.md): the implementation's attention over
the stored records within the stored per-output budget of the stored float64 output; where the inputs are
stored, its encode of them must store the records (bit-exact tier)."""
from __future__ import annotations

import pytest

from . import attention_checks, golden_format as golden
from .conftest import selected_methods


def _cases(config):
    try:
        cases = list(golden.iter_attention_cases())
    except (OSError, ValueError, KeyError) as e:
        return None, f"golden attention cases not readable at {golden.ROOT}: {type(e).__name__}: {e}"
    methods = set(selected_methods(config))
    return [c for c in cases if c.method in methods], None


def pytest_generate_tests(metafunc):
    if "att_case" not in metafunc.fixturenames:
        return
    cases, reason = _cases(metafunc.config)
    if not cases:   # a failure, never a skip
        metafunc.parametrize("att_case", [pytest.param(reason or "no golden attention case for the selected "
                                                       "methods")], ids=["golden-attention-missing"])
        return
    metafunc.parametrize("att_case", cases, ids=[c.id for c in cases])


def test_golden_attention(impl, methods_ok, tally, att_case, record_property):
    if isinstance(att_case, str):
        pytest.fail(att_case, pytrace=False)
    c = att_case
    methods_ok(c.method)
    record_property("method", c.method)
    record_property("bits", c.k_params.bits)
    record_property("dtype", c.dtype)
    tally.case()
    attention_checks.check_golden_attention(impl, c)
