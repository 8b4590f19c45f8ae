"""tests/checkout_suite.py: `pytest conformance ...` is collected through veloxquant/conformance, so the suite's
modules are veloxquant.conformance.* (conformance/conftest.py refuses any other name)."""
from __future__ import annotations

import subprocess
import sys

from checkout_suite import ROOT, linked


def test_suite_paths_are_spelled_through_the_package():
    assert linked("conformance", ROOT) == "veloxquant/conformance"
    assert linked("./conformance/", ROOT) == "veloxquant/conformance"
    assert linked("conformance/test_golden.py::test_golden[kivi-b2/x]", ROOT) == \
        "veloxquant/conformance/test_golden.py::test_golden[kivi-b2/x]"
    assert linked(str(ROOT / "conformance" / "adapters"), ROOT) == "veloxquant/conformance/adapters"
    assert linked("test_golden.py", ROOT / "conformance") == "../veloxquant/conformance/test_golden.py"


def test_other_paths_are_left_alone():
    for arg in ("tests/test_layering.py", "veloxquant/conformance", "benchmarks", "conformance_notes.md",
                "docs/conformance", "."):
        assert linked(arg, ROOT) == arg


def test_pytest_names_the_suite_veloxquant_conformance(tmp_path):
    """A real `pytest conformance/...` run from the checkout root: the test module and the conftest are
    veloxquant.conformance.*, and no module named conformance.* is imported."""
    probe = tmp_path / "probe.py"
    probe.write_text("import sys, pytest\n"
                     "rc = pytest.main(sys.argv[1:])\n"
                     "print('TOP', sorted(m for m in sys.modules if m.split('.')[0] == 'conformance'))\n"
                     "print('VQ', sorted(m for m in sys.modules if m in ('veloxquant.conformance.conftest', "
                     "'veloxquant.conformance.test_golden')))\n"
                     "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, str(probe), "conformance/test_golden.py", "--collect-only", "-q",
                        "--impl", "reference", "-k", "golden_cast"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "TOP []" in r.stdout, r.stdout[-2000:]
    assert "VQ ['veloxquant.conformance.conftest', 'veloxquant.conformance.test_golden']" in r.stdout, r.stdout[-2000:]
    assert "veloxquant/conformance/test_golden.py::test_golden_cast[float16]" in r.stdout, r.stdout[-2000:]
