"""`veloxquant bench` as a new user meets it: the paths typed (--json, --gate) are the caller's, not the checkout's
(pytest runs in the checkout); a device or a plugin that is not there is one line and exit 2 before pytest runs;
--help says where the pytest flags go. pytest itself is not run here: subprocess.run is replaced by a recorder."""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess

import mlx.core as mx
import pytest

from veloxquant.tools import bench


def _args(argv):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args, rest = p.parse_known_args(argv)
    args.passthrough = rest
    return args


@pytest.fixture
def fake_pytest(monkeypatch, tmp_path):
    """subprocess.run recorded; it writes the --benchmark-json it is given only under tmp_path (a relative one would
    land in its cwd, the checkout, and the default is the checkout's .benchmarks/: not written, so such a run reports
    no JSON and the checkout stays clean)."""
    calls = []

    def run(cmd, cwd=None, **kw):
        calls.append((cmd, cwd))
        out = pathlib.Path(cmd[cmd.index("--benchmark-json") + 1])
        if out.is_absolute() and out.is_relative_to(tmp_path):
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"benchmarks": []}))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(bench.subprocess, "run", run)
    monkeypatch.setattr(mx, "is_available", lambda device: True)
    return calls


def test_relative_json_and_gate_are_the_callers(tmp_path, monkeypatch, fake_pytest, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.json").write_text("{}")
    code = bench.run(_args(["--json", "r.json", "--gate", "mine.json"]))
    err = capsys.readouterr().err
    assert code == 0, err
    assert (tmp_path / "r.json").is_file(), "the run's JSON goes where the caller said, from the caller's folder"
    cmd, cwd = fake_pytest[0]
    assert cmd[cmd.index("--benchmark-json") + 1] == str(tmp_path / "r.json"), cmd
    assert cmd[cmd.index("--bench-gate") + 1] == str(tmp_path / "mine.json"), cmd


def test_gpu_without_a_gpu_is_one_line_before_pytest(monkeypatch, fake_pytest, capsys):
    monkeypatch.setattr(mx, "is_available", lambda device: False)
    code = bench.run(_args(["--device", "gpu"]))
    out, err = capsys.readouterr()
    assert code == 2 and not fake_pytest, (code, err)
    assert err == "veloxquant bench: --device gpu, but this MLX build has no GPU\n", err


def test_help_says_where_pytest_flags_go(capsys):
    p = argparse.ArgumentParser(prog="veloxquant bench")
    bench.add_arguments(p)
    help_text = p.format_help()
    assert "--bench-contexts" in help_text and "after --" in help_text.replace("\n", " "), help_text


def test_the_run_is_rendered_on_stdout_and_markdown_holds_it_alone(tmp_path, monkeypatch, fake_pytest, capsys):
    """The ratios to fp16 (the README's figures) are printed after the run, not only pytest-benchmark's absolute
    times; --markdown holds this run alone, not the docs page with the run filed under docs/bench/'s kept runs."""
    from veloxquant.tools.bench import render
    monkeypatch.setattr(render, "render", lambda data, name: ["### this run", "", "| arm | ratio |", f"({name})"])
    md = tmp_path / "r.md"
    code = bench.run(_args(["--json", str(tmp_path / "r.json"), "--markdown", str(md)]))
    out = capsys.readouterr().out
    assert code == 0
    assert "### this run" in out and "| arm | ratio |" in out, out
    text = md.read_text()
    assert "### this run" in text and "Other kept runs" not in text and "# Benchmarks" not in text, text


def test_no_checkout_or_no_plugin_is_one_line_naming_what_to_install(tmp_path, monkeypatch, fake_pytest, capsys):
    import importlib.util
    monkeypatch.setattr(bench, "BENCHMARKS", tmp_path / "no-benchmarks")     # a wheel: benchmarks/ is not in it
    assert bench.run(_args([])) == 2 and not fake_pytest
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("veloxquant bench: ") and "pip install -e '.[dev]'" in err, err
    monkeypatch.undo()
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: fake_pytest.append(a))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pytest_benchmark" else real(name, *a))
    assert bench.run(_args([])) == 2 and not fake_pytest
    err = capsys.readouterr().err
    assert err == "veloxquant bench: needs pytest-benchmark, not installed here; install the extra with: pip install -e '.[dev]'\n", err


def test_the_default_gate_is_the_devices_kind(tmp_path, monkeypatch):
    """--gate with no file: the CPU's baseline, a GPU's kind by its name where one is saved (an H100's h100.json, the
    runs the H100 sessions make), else the H200's; the name read from MLX when not given."""
    monkeypatch.setattr(bench, "BASELINES", tmp_path)
    for n in ("cpu", "h200"):
        (tmp_path / f"{n}.json").write_text("{}")
    assert bench.gate_baseline("cpu") == tmp_path / "cpu.json"
    assert bench.gate_baseline("gpu", "NVIDIA H100 80GB HBM3") == tmp_path / "h200.json", "no H100 run saved yet"
    (tmp_path / "h100.json").write_text("{}")
    assert bench.gate_baseline("gpu", "NVIDIA H100 80GB HBM3") == tmp_path / "h100.json"
    assert bench.gate_baseline("gpu", "NVIDIA H200") == tmp_path / "h200.json"
    assert bench.gate_baseline("gpu", "NVIDIA A100-SXM4-80GB") == tmp_path / "h200.json"
    from veloxquant.tools.bench import harness
    monkeypatch.setattr(harness, "device_info", lambda: {"name": "NVIDIA H100 PCIe"})
    assert bench.gate_baseline("gpu") == tmp_path / "h100.json"
    args = _args(["--device", "gpu", "--gate"])
    cmd = bench.pytest_command(args, tmp_path / "r.json")
    assert cmd[cmd.index("--bench-gate") + 1] == str(tmp_path / "h100.json"), cmd
