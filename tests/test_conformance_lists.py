"""The skip/xfail list matcher of conformance/conftest.py: `*`/`?` are wildcards, brackets are literal."""
from __future__ import annotations

import pytest

from veloxquant.conformance.conftest import _id_matches


@pytest.mark.parametrize("sid,pattern,expected", [
    ("test_bad_input.py::test_encode_rejects[mlx_affine-float16]", "test_bad_input.py::test_encode_rejects[mlx_affine-*]", True),
    ("test_bad_input.py::test_encode_rejects[kivi-float16]", "test_bad_input.py::test_encode_rejects[mlx_affine-*]", False),
    ("test_golden.py::test_golden[mlx_affine-b4-d32-f32-nan-error-000]", "test_golden.py::test_golden[mlx_affine-*-nan-error-*]", True),
    ("test_golden.py::test_golden[mlx_affine-b4-d32-f32-nan-error-000]", "test_golden.py::test_golden[mlx_affine-*-inf-error-*]", False),
    ("test_x.py::t[a]", "test_x.py::t[?]", True),
    ("test_x.py::t[ab]", "test_x.py::t[?]", False),
    ("test_x.py::aXb", "test_x.py::a.b", False),      # '.' is literal, not a regex wildcard
    ("test_x.py::t[a]", "test_x.py::t", False),       # whole-id match, not a prefix
])
def test_id_matches(sid, pattern, expected):
    assert _id_matches(sid, pattern) is expected
