"""golden/bulk/attention.npz (tools/golden/attention.py): the stored float64 outputs and budgets are
spec/attention.md's formula and budget as conformance/attention_checks.py computes them (attention_f64,
attention_budget), so a third party checking against the stored numbers checks what the suite checks."""
from __future__ import annotations

import numpy as np

from veloxquant import reference
from veloxquant.conformance import attention_checks, golden_format as golden


def test_stored_outputs_and_budgets_are_the_suites():
    cases = list(golden.iter_attention_cases())
    assert {c.method for c in cases} == set(reference.METHODS)
    assert {"attention-gqa", "attention-causal", "attention-long"} <= {f for c in cases for f in c.flags}
    for c in cases:
        k = reference.decode(c.k_record, c.k_params, c.dtype)
        v = reference.decode(c.v_record, c.v_params, c.dtype)
        out, p, k64, v64 = attention_checks.attention_f64(c.q, k, v, c.scale, c.mask)
        assert np.allclose(c.out, out, rtol=1e-12, atol=1e-300), c.id
        budget = attention_checks.attention_budget(
            c.q, k64, v64, p, c.scale, c.k_params.method in attention_checks.ROTATED_METHODS,
            c.v_params.method in attention_checks.ROTATED_METHODS,
            attention_checks.group_zero_magnitude(c.k_record, c.k_params, k.shape[2], c.dtype),
            attention_checks.group_zero_magnitude(c.v_record, c.v_params, v.shape[2], c.dtype))
        assert np.allclose(c.budget, budget, rtol=1e-9, atol=0), c.id


def test_long_case_peaks_in_the_second_block():
    c = next(c for c in golden.iter_attention_cases() if "attention-long" in c.flags)
    k = reference.decode(c.k_record, c.k_params, c.dtype)[0, 0]
    assert k.shape[0] > 2048
    for i in range(c.q.shape[1]):
        assert int(np.argmax(k @ c.q[0, i, 0])) >= 2048
