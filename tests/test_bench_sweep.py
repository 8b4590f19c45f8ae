"""tools/bench/sweep.py's arithmetic and rendering on a hand-made result (numbers invented for the test, not a
measurement), and one real CPU run of its timing loop with trivial arms (structure only)."""
from __future__ import annotations

import json

import mlx.core as mx
import pytest

from veloxquant.tools import bench
from veloxquant.tools.bench import sweep as bench_sweep


def _arm(t: float, moved: int, xbytes: int, **ratios) -> dict:
    s = {"median_s": t, "iqr_s": t / 10, "n": 30, "moved_bytes": moved, "x_GBps": xbytes / t / 1e9,
         "moved_GBps": moved / t / 1e9}
    for base, r in ratios.items():
        s[f"ratio_to[{base}]"] = {"median": r, "iqr": 0.01}
    return s


def _result() -> dict:
    groups = []
    for n in (8192, 262144):
        xb = n * 128 * 2
        copy = _arm(1e-4 * n / 8192, 2 * xb, xb)
        enc = {"fp16 copy": copy,
               "mx.quantize g64 b4": _arm(2e-4 * n / 8192, xb + xb // 4, xb, **{"fp16 copy": 2.0}),
               "kernel turboquant b=4": _arm(0.9e-4 * n / 8192, xb + 68 * n, xb,
                                             **{"fp16 copy": 0.9, "mx.quantize g64 b4": 0.45}),
               "kernel rabitq": _arm(3e-4 * n / 8192, xb + 24 * n, xb,
                                     **{"fp16 copy": 3.0, "mx.quantize g64 b4": 1.5})}
        dec = {"fp16 copy": copy, "mx.dequantize g64 b4": _arm(1e-4 * n / 8192, xb, xb, **{"fp16 copy": 1.0}),
               "kernel turboquant b=4": _arm(1e-4 * n / 8192, 68 * n + 4 * 128 * n, xb,
                                             **{"fp16 copy": 1.0, "mx.dequantize g64 b4": 1.0})}
        groups += [{"title": f"encode N={n}", "op": "encode", "n": n, "x_bytes": xb, "arms": enc},
                   {"title": f"decode N={n}", "op": "decode", "n": n, "x_bytes": xb, "arms": dec}]
    groups.append({"title": "encode one decode step", "op": "step", "n": 8, "x_bytes": 2048,
                   "arms": {"fp16 copy": _arm(5e-5, 0, 2048), "kernel rabitq": _arm(6e-5, 0, 2048, **{"fp16 copy": 1.2}),
                            "api now rabitq": _arm(2e-4, 0, 2048, **{"fp16 copy": 4.0})}})
    return {"schema": bench_sweep.SCHEMA, "date": "2026-11-30T00:00:00+00:00", "device": "Device(gpu, 0)",
            "device_info": {"device_name": "Test GPU"}, "backend": "CUDA", "versions": {"mlx": "0.32.4", "spec": "1.0.0"},
            "command": "python3 -m veloxquant.tools.bench.sweep --json x.json", "settings": {"warmup": 3, "iters": 30, "pool": 10,
                                                                             "target_n": 262144},
            "groups": groups, "wall_s": 1.0}


def test_targets_arithmetic():
    rows = bench_sweep.targets(_result())
    assert [(r["op"], r["case"]) for r in rows] == [("encode", "turboquant b=4"), ("encode", "rabitq"),
                                                     ("decode", "turboquant b=4")]
    tq, rb, dq = rows
    assert tq["speedup"] == pytest.approx(1 / 0.45)
    assert tq["copy_fraction"] == pytest.approx((256 + 68) / 0.9 / (2 * 256)) and tq["met"] is True
    assert rb["speedup"] == pytest.approx(1 / 1.5) and rb["met"] is False
    assert dq["speedup"] == pytest.approx(1.0) and dq["met"] is False


def test_targets_need_both():
    res = _result()
    for g in res["groups"]:
        if g["op"] == "encode":
            g["arms"]["kernel turboquant b=4"]["moved_GBps"] = g["arms"]["fp16 copy"]["moved_GBps"] * 0.4
    tq = bench_sweep.targets(res)[0]
    assert tq["speedup"] > 2 and tq["copy_fraction"] == pytest.approx(0.4) and tq["met"] is False


def test_render_and_figure(tmp_path):
    res = _result()
    md = bench.render_markdown([(res, "docs/bench/x.json")], {"docs/bench/x.json": "fig.png"})
    assert "fused kernels against the memory" in md and "![" in md and "| encode | 262144 | turboquant b=4 |" in md
    assert "api now rabitq" in md and "In the sweep" in md
    assert "**What the kernels cost**" in md and "| encode | turboquant |" in md   # docs/bench/kernel-resources
    pytest.importorskip("matplotlib")
    figs = bench.write_figures([(res, "docs/bench/x.json")], tmp_path, log=lambda *a: None)
    assert figs == {"docs/bench/x.json": "benchmarks-test-gpu-kernels-sweep.png"}
    assert (tmp_path / figs["docs/bench/x.json"]).stat().st_size > 10_000
    # the CLI path: --from-json renders the same text
    p = tmp_path / "x.json"
    p.write_text(json.dumps(res))
    out = tmp_path / "benchmarks.md"
    import argparse
    ap = argparse.ArgumentParser()
    bench.add_arguments(ap)
    assert bench.run(ap.parse_args(["--from-json", str(p), "--markdown", str(out)])) == 0
    assert "| encode | 262144 | turboquant b=4 |" in out.read_text()


def test_group_runs_interleaved_on_cpu():
    xs = [mx.ones((4, 4)) * i for i in range(bench_sweep.POOL)]
    arms = {"fp16 copy": lambda i: xs[i] * 1, "kernel a": lambda i: xs[i] + 1}
    g = bench_sweep.group("t", 16, "encode", arms, {"fp16 copy": 64, "kernel a": 64}, 1, 4, ("fp16 copy",))
    assert g["arms"]["kernel a"]["n"] == 4 and "ratio_to[fp16 copy]" in g["arms"]["kernel a"]
    assert g["arms"]["fp16 copy"]["x_GBps"] > 0


def test_group_per_eval_calls_distinct_inputs():
    """per_eval = K: each timed evaluation calls the arm on K different pool inputs (not K times the same)."""
    seen = []
    xs = [mx.ones((4, 4)) * i for i in range(bench_sweep.POOL)]
    arms = {"fp16 copy": lambda i: (seen.append(i), xs[i] * 1)[1], "kernel a": lambda i: xs[i] + 1}
    g = bench_sweep.group("t", 16, "encode", arms, {"fp16 copy": 64, "kernel a": 64}, 0, 2, ("fp16 copy",),
                          per_eval=3)
    assert g["per_eval"] == 3 and g["arms"]["kernel a"]["n"] == 2
    assert seen == [0, 1, 2, 1, 2, 3], seen


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="g++ not installed: no CPU emulation")
def test_sweep_runs_with_emulated_kernels(monkeypatch, tune):
    """The whole measuring path (pools, records, every case's kernel arms, the decode-step group) on tiny
    shapes, with the CPU emulator standing in for the GPU kernels: catches errors before a GPU session."""
    import _kernel_emulator as ke
    ke.install(monkeypatch, tune, ke.build())
    monkeypatch.setattr(bench_sweep, "POOL", 2)
    groups = bench_sweep.sweep_groups([256], 0, 1, log=lambda *a, **k: None)
    assert [g["op"] for g in groups] == ["encode", "decode"]
    assert {bench_sweep.case_of(a) for a in groups[0]["arms"]} - {None} == {c[0] for c in bench_sweep.CASES}
    step = bench_sweep.decode_step_group(0, 1, log=lambda *a, **k: None)
    assert len(step["arms"]) == 2 + 3 * len(bench_sweep.CASES)


def test_merge_conformance_reports():
    """tools/cli/conformance.py merge_reports: per-method runs (kernel_check runs them in parallel) into one report."""
    from veloxquant.tools.cli import conformance as tc

    def rep(method, outcome, extra_unmatched):
        tests = [{"id": f"conformance/test_differential.py::test_encode_decode[{method}-b2-float16]",
                  "outcome": outcome, "message": None if outcome == "passed" else "boom", "method": method,
                  "bits": 2, "dtype": "float16", "cases": 20},
                 {"id": "conformance/test_mutants.py::test_mutant[x]", "outcome": "passed", "message": None}]
        return {"schema": tc.SCHEMA, "date": f"2026-11-30T00:00:0{len(method) % 10}+00:00", "duration_s": len(method),
                "impl": "mlx_kernels", "device": "gpu", "methods": [method], "profile": "ci",
                "pytest_exit_code": 0 if outcome == "passed" else 1, "versions": {}, "summary": {},
                "cells": [], "tests": tests, "unmatched_skip_xfail": [{"kind": "skip", "test": "a"}] + extra_unmatched}
    m = tc.merge_reports([rep("kivi", "passed", [{"kind": "skip", "test": "b"}]), rep("rabitq", "failed", [])],
                         ["k.json", "r.json"])
    assert m["methods"] == ["kivi", "rabitq"] and m["pytest_exit_code"] == 1 and m["duration_s"] == 6
    assert m["summary"]["passed"] == 2 and m["summary"]["failed"] == 1 and len(m["tests"]) == 3   # mutant once
    assert m["unmatched_skip_xfail"] == [{"kind": "skip", "test": "a"}] and m["merged_from"] == ["k.json", "r.json"]
    assert [c["failed"] for c in m["cells"] if c["method"] == "rabitq"] == [1]
