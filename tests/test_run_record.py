"""tools/_env.py run_record: the command, date, device and versions that open every tool's JSON record."""
from __future__ import annotations

import datetime
import sys

from veloxquant.tools import _env


def test_run_record_names_the_command_with_its_arguments(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["tool.py", "--arms", "turboquant b4", "--json", "out.json"])
    rec = _env.run_record("python -m veloxquant.tools.dev.x", device="cpu")
    assert list(rec) == ["command", "date", "device", "versions"], rec
    assert rec["command"] == "python -m veloxquant.tools.dev.x --arms turboquant b4 --json out.json"
    assert rec["device"] == "cpu" and rec["versions"]["spec"] and "git" in rec["versions"]
    assert datetime.datetime.fromisoformat(rec["date"]).tzinfo is not None
    # argv given (a main(argv) call) wins over sys.argv; quote=True makes the line paste back into a shell
    quoted = _env.run_record("veloxquant memory", ["--arms", "kivi b4"], device={}, quote=True)["command"]
    assert quoted == "veloxquant memory --arms 'kivi b4'" and _env.command_line("p", []) == "p"


def test_run_record_describes_the_device_where_none_is_given():
    dev = _env.run_record("p", [])["device"]
    assert dev["type"] in ("cpu", "gpu") and dev["default_device"], dev
