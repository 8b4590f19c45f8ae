"""The test profiles of tests/conftest.py: a bare `pytest` leaves the slow families out, `--full`, `-m` or named
paths run what they select; every slow family named there exists (a renamed test would silently come back into
the quick profile otherwise)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import conftest as profiles  # tests/conftest.py (tests/ is on sys.path, as for _batch_util)

ROOT = Path(__file__).resolve().parents[1]


class _Item:
    def __init__(self, nodeid):
        self.nodeid = nodeid
        self.markers = []

    def add_marker(self, m):
        self.markers.append(m)


class _Config:
    def __init__(self, full=False, markexpr="", source=pytest.Config.ArgsSource.TESTPATHS):
        self._opts = {"--full": full, "markexpr": markexpr}
        self.args_source = source
        self.deselected = []
        self.hook = self

    def getoption(self, name):
        return self._opts[name]

    def pytest_deselected(self, items):
        self.deselected += items


def _items():
    slow = [f"{s}::test_x[a]" if "::" not in s else f"{s}[b]" for s in profiles.SLOW]
    return slow, ["tests/test_quick_one.py::test_a", "conformance/test_golden.py::test_golden[x]"]


@pytest.mark.parametrize("config, runs_slow", [
    (_Config(), False),
    (_Config(full=True), True),
    (_Config(markexpr="slow"), True),
    (_Config(source=pytest.Config.ArgsSource.ARGS), True),
])
def test_profile_selection(config, runs_slow):
    slow, quick = _items()
    assert slow, "tests/conftest.py names no slow family"
    items = [_Item(i) for i in slow + quick]
    profiles.pytest_collection_modifyitems(config, items)
    kept = [i.nodeid for i in items]
    assert all(i in kept for i in quick)
    assert all((i in kept) == runs_slow for i in slow), kept
    assert sorted(i.nodeid for i in config.deselected) == ([] if runs_slow else sorted(slow))


def test_slow_families_exist():
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--full", "-p", "no:cacheprovider",
                        "tests"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    ids = [line for line in r.stdout.splitlines() if "::" in line]
    assert ids, r.stdout[-2000:] + r.stderr[-2000:]
    for family in profiles.SLOW:
        assert any(profiles._is_slow(i) and (i == family or i.startswith(family + "::") or i.startswith(family + "["))
                   for i in ids), f"tests/conftest.py SLOW names {family}, which matches no test"
