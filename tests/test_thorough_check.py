"""tools/dev/thorough_check.py: the thorough differential cells under a time budget, resumable (the log parser, the
grouping, and end to end on the numpy reference and on a broken implementation)."""
from __future__ import annotations

import json

import pytest

from veloxquant.tools.dev import thorough_check as tc

LOG = """\
conformance/test_differential.py::test_encode_decode[kivi-b4-float16] PASSED [ 50%]
conformance/test_differential.py::test_encode_decode[kivi-b8-float16] FAILED [100%]
============================ Hypothesis Statistics =============================
conformance/test_differential.py::test_encode_decode[kivi-b4-float16]:

  - during generate phase (300.1 seconds):
    - Typical runtimes: ~ 3-2081 ms, of which ~ 1-5 ms in data generation
    - 10000 passing, 0 failing, and 174 invalid test cases

  - Stopped because settings.max_examples=10000

conformance/test_differential.py::test_encode_decode[kivi-b8-float16]:

  - during generate phase (10.0 seconds):
    - 41 passing, 1 failing, and 0 invalid test cases
  - during shrink phase (1.0 seconds):
    - 3 passing, 5 failing, and 0 invalid test cases

============================= slowest durations ==============================
346.17s call     conformance/test_differential.py::test_encode_decode[kivi-b4-float16]
12.00s call     conformance/test_differential.py::test_encode_decode[kivi-b8-float16]
"""


def test_parse_log_reads_status_examples_and_seconds():
    got = tc.parse_log(LOG)
    assert got["kivi-b4-float16"] == {"status": "passed", "examples": 10000, "invalid": 174, "seconds": 346.17}, got
    assert got["kivi-b8-float16"]["status"] == "failed", got
    assert got["kivi-b8-float16"]["examples"] == 41 + 1 + 3 + 5, got


def test_parse_log_of_a_cut_process_has_no_result_for_the_running_cell():
    text = LOG.split("=" * 28)[0].splitlines()[0] + "\nconformance/test_differential.py::test_encode_decode[kivi-b8-float16] "
    got = tc.parse_log(text)
    assert got == {"kivi-b4-float16": {"status": "passed"}}, got


def test_split_cell():
    assert tc.split_cell("turboquant_rvq-b2-bfloat16") == ("turboquant_rvq", 2, "bfloat16")
    with pytest.raises(ValueError, match="split_cell"):
        tc.split_cell("turboquant-4-float16")


def test_plan_groups_one_method_and_dtype_headline_bits_first():
    cells = [f"kivi-b{b}-{dt}" for b in (1, 2, 4, 8) for dt in ("float16", "float32")] + ["rabitq-b1-float16"]
    groups = tc.plan(cells, jobs=3)
    assert sorted(c for _, cs in groups for c in cs) == sorted(cells), groups
    for name, cs in groups:
        assert len({tc.split_cell(c)[0] for c in cs}) == 1 and len({tc.split_cell(c)[2] for c in cs}) == 1, groups
    kivi16 = next(cs for name, cs in groups if name == "kivi-float16")
    assert [tc.split_cell(c)[1] for c in kivi16] == [4, 2, 8, 1], groups
    # more jobs than groups: the largest split in halves, never below one cell per group
    many = tc.plan(cells, jobs=6)
    assert len(many) == 6 and all(cs for _, cs in many), many
    assert len(tc.plan(cells, jobs=100)) == len(cells)


def _run(tmp_path, *args):
    out = tmp_path / "out"
    rc = tc.main(["--out", str(out), "--device", "", "--jobs", "3", "--max-examples", "5", *args])
    return rc, json.loads((out / "summary.json").read_text())


def test_end_to_end_on_the_ops_path_then_resumed(tmp_path):
    rc, s = _run(tmp_path, "--impl", "mlx_ops", "--methods", "rabitq")
    assert rc == 0 and s["counts"] == {"passed": 3}, s
    assert all(e["examples"] == 5 for e in s["cells"].values()), s
    first = tmp_path / "first.json"
    first.write_text(json.dumps(s))
    rc, s2 = _run(tmp_path, "--impl", "mlx_ops", "--methods", "rabitq", "--done", str(first))
    assert rc == 0 and s2["cells"] == {} and sorted(s2["skipped_as_done"]) == sorted(s["cells"]), s2


def test_end_to_end_reports_a_broken_implementation_as_failed(tmp_path):
    rc, s = _run(tmp_path, "--impl", "veloxquant.conformance.mutants:MsbFirstPacking", "--methods", "rabitq")
    assert rc == 1 and s["counts"] == {"failed": 3}, s


def test_a_skipped_cell_is_reported_and_fails_the_run(tmp_path):
    # the reference is the oracle: the differential test skips it (a run that checked nothing must not pass)
    rc, s = _run(tmp_path, "--impl", "reference", "--methods", "rabitq")
    assert rc == 1 and s["counts"] == {"skipped": 3}, s


def test_deadline_marks_running_cells_cut_and_the_rest_not_started(tmp_path):
    rc, s = _run(tmp_path, "--impl", "mlx_ops", "--methods", "turboquant", "--deadline", "0", "--max-examples",
                 "100000")
    assert s["counts"].get("passed", 0) == 0 and s["counts"]["cut"] == 3 and s["counts"]["not-started"] == 9, s
