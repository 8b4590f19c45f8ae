"""Golden attention cases (golden/bulk/attention.npz, spec/attention.md): the implementation's attention over
the stored records within the stored per-output budget of the stored float64 output; where the inputs are
stored, its encode of them must store the records (bit-exact tier)."""
from __future__ import annotations

import pytest

from . import attention_checks, golden_format as golden
from .conftest import parametrize_golden


def pytest_generate_tests(metafunc):
    parametrize_golden(metafunc, "att_case", golden.iter_attention_cases, "golden attention cases",
                       "golden-attention-missing")


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
