"""--bench-partial's file (benchmarks/conftest.py): rewritten after every benchmark with `partial` true, and false once
the session ran every selected benchmark, so that docs/benchmarks.md calls only a run cut short partial; the host
probe (benchmarks/harness.py host_probe) at a run's start and end, and its line on the rendered page."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _conftest(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_conftest", ROOT / "benchmarks" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _session(path: pathlib.Path, shouldstop=False, shouldfail=False):
    b = types.SimpleNamespace(partial=path, done=[{"name": "test_x"}], started="2026-12-06T00:00:00", _meta={},
                              host={"start": {"mlx_op_build_us": 1.0, "python_sum1000_us": 10.0}})
    return types.SimpleNamespace(config=types.SimpleNamespace(_veloxquant_bench=b), shouldstop=shouldstop,
                                 shouldfail=shouldfail)


@pytest.mark.parametrize("exitstatus, stop, fail, whole", [
    (pytest.ExitCode.OK, False, False, True),
    (pytest.ExitCode.TESTS_FAILED, False, False, True),                 # every benchmark ran; one failed
    (pytest.ExitCode.TESTS_FAILED, False, "stopping after 1 failures", False),     # -x / --maxfail
    (pytest.ExitCode.INTERRUPTED, "KeyboardInterrupt", False, False),
])
def test_the_session_end_marks_a_whole_run(exitstatus, stop, fail, whole, tmp_path, monkeypatch):
    conftest = _conftest(monkeypatch)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"partial": True}))
    hook = conftest.pytest_sessionfinish(_session(path, stop, fail), exitstatus)     # (a hook wrapper: around
    next(hook)                                                                          # pytest-benchmark's own)
    with pytest.raises(StopIteration):
        next(hook)
    got = json.loads(path.read_text())
    assert got["partial"] is (not whole), (exitstatus, stop, fail, got)
    if whole:
        assert got["benchmarks"] == [{"name": "test_x"}], got


def test_a_run_to_its_end_is_not_partial(tmp_path):
    """One quick CPU benchmark through pytest: its file, written after the benchmark as partial, ends whole."""
    path = tmp_path / "ops.json"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "benchmarks/test_ops.py",
                        "--device", "cpu", "-k", "turboquant and encode", "--bench-partial", str(path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       # (an xdist worker's variables would make pytest-benchmark in the child skip its timing)
                       env={k: v for k, v in os.environ.items()
                            if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = json.loads(path.read_text())
    assert got["partial"] is False and len(got["benchmarks"]) == 1, got
    probe = got["veloxquant"]["host_probe"]
    assert set(probe) == {"start", "end"}, probe
    assert all(0 < p[k] < 1e5 for p in probe.values() for k in ("mlx_op_build_us", "python_sum1000_us")), probe


def test_the_page_names_the_host_probe():
    from veloxquant.tools.bench import render
    run = {"veloxquant": {"host_probe": {"start": {"mlx_op_build_us": 0.88, "python_sum1000_us": 11.4},
                                         "end": {"mlx_op_build_us": 1.25, "python_sum1000_us": 15.0}}},
           "benchmarks": []}
    lines = render.render(run, "r.json")
    assert any("Host probe (start → end): MLX op build 0.88 → 1.25 µs" in line and "11.4 → 15.0 µs" in line
               for line in lines), lines
    del run["veloxquant"]["host_probe"]["end"]
    assert any("Host probe (start): MLX op build 0.88 µs" in line for line in render.render(run, "r.json"))
    assert not any("Host probe" in line for line in render.render({"benchmarks": []}, "r.json"))


def test_the_page_names_a_gpu_runs_host_cpu():
    from veloxquant.tools.bench import harness, render
    info = harness.device_info()
    assert info.get("cpu") is None or isinstance(info["cpu"], str) and info["cpu"], info
    gpu = {"veloxquant": {"device": {"name": "NVIDIA H100 80GB HBM3", "cpu": "Intel(R) Xeon(R) Processor",
                                     "cpu_count": 16}}, "benchmarks": []}
    assert any(line.startswith("- Machine: NVIDIA H100 80GB HBM3, Intel(R) Xeon(R) Processor host, 16 CPU cores")
               for line in render.render(gpu, "g.json")), render.render(gpu, "g.json")
    cpu = {"veloxquant": {"device": {"name": "AMD EPYC", "cpu": "AMD EPYC", "cpu_count": 2}}, "benchmarks": []}
    assert any(line.startswith("- Machine: AMD EPYC, 2 CPU cores") for line in render.render(cpu, "c.json"))
