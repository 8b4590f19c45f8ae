"""tools/dev/bench_attention.py without a GPU: its variant parsing (the timing itself needs the kernels)."""
from __future__ import annotations

import pytest

from veloxquant.accelerated.kernels import attention as katt
from veloxquant.tools.dev import bench_attention as ba


def test_presets_name_only_existing_constants():
    for name in ba.PRESETS:
        for _, knobs in ba.parse_variants(name, None):
            for k in knobs:
                assert hasattr(katt, k), f"preset {name}: accelerated.kernels.attention has no {k}"
    assert all(hasattr(katt, k) for k in ba.KNOBS)


def test_unknown_constant_is_an_error_naming_it():
    with pytest.raises(ValueError, match="TC_PREFECH"):
        ba.parse_variants(None, '[["typo", {"TC_PREFECH": 1}]]')
    with pytest.raises(ValueError, match="no variants"):
        ba.parse_variants(None, "[]")
    assert ba.parse_variants(None, '[["a", {"TC_WAVES": 2}]]') == [("a", {"TC_WAVES": 2})]


def test_without_kernels_it_says_why(capsys):
    if katt.backend.backend() is not None:
        pytest.skip("a GPU backend is present: the benchmark would run")
    assert ba.main(["--preset", "tc-shape", "--contexts", "16"]) == 2
    assert "bench_attention" in capsys.readouterr().err
