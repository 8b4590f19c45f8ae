"""tools/dev/bench_attention.py without a GPU: its variant parsing (the timing itself needs the kernels)."""
from __future__ import annotations

import pytest

from veloxquant.accelerated import tuning
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.tools.dev import bench_attention as ba


def test_presets_name_only_tuning_knobs():
    for name in ba.PRESETS:
        for _, knobs in ba.parse_variants(name, None):
            assert set(knobs) <= set(ba.KNOBS), f"preset {name}: {sorted(set(knobs) - set(ba.KNOBS))}"
            tuning.DEFAULT.replace(**knobs)          # names and types of accelerated.tuning.Tuning
    assert set(ba.KNOBS) <= set(tuning.NAMES)


def test_unknown_knob_or_bad_value_is_an_error_naming_it():
    with pytest.raises(ValueError, match="TC_PREFECH"):
        ba.parse_variants(None, '[["typo", {"TC_PREFECH": 1}]]')
    with pytest.raises(ValueError, match="shared"):                 # a knob, but not one of this benchmark's
        ba.parse_variants(None, '[["other", {"shared": false}]]')
    with pytest.raises(ValueError, match="tc_waves"):
        ba.parse_variants(None, '[["bad", {"tc_waves": 0}]]')
    with pytest.raises(ValueError, match="no variants"):
        ba.parse_variants(None, "[]")
    assert ba.parse_variants(None, '[["a", {"TC_WAVES": 2, "cold_loops": 1}]]') == [
        ("a", {"tc_waves": 2, "cold_loops": True})]


def test_without_kernels_it_says_why(capsys):
    if katt.backend.backend() is not None:
        pytest.skip("a GPU backend is present: the benchmark would run")
    assert ba.main(["--preset", "tc-shape", "--contexts", "16"]) == 2
    assert "bench_attention" in capsys.readouterr().err
