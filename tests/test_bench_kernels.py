"""benchmarks/test_kernels.py (the fused kernels against the memory; it replaced tools/bench/sweep.py) without a GPU:
the benchmark skips with the reason where the kernels cannot run, its whole measuring path runs with the CPU emulator
standing in for the GPU kernels (records, bytes moved, GB/s per arm), and its table renders (numbers invented for the
test, not a measurement). Also kernel_check's merge of per-method conformance reports."""
from __future__ import annotations

import types

import mlx.core as mx
import pytest

from veloxquant.tools.bench import render as bench_render

from _bench_util import Benchmark, benchmark_module


def _bench(mod):
    sizes = {k: dict(v) for k, v in mod.harness.SIZES["cpu"].items()}
    sizes["kernels"].update(rounds=1, warmup=0)
    return types.SimpleNamespace(device="cpu", sizes=sizes, gate=lambda *a: None)


def test_skips_with_the_reason_where_the_kernels_cannot_run(monkeypatch):
    mod = benchmark_module("test_kernels", monkeypatch)
    from veloxquant.accelerated import kernels
    monkeypatch.setattr(kernels, "available", lambda: (False, "no GPU backend in this MLX build"))
    with pytest.raises(pytest.skip.Exception, match="no GPU backend in this MLX build"):
        mod.test_kernels(Benchmark(), _bench(mod), None, "turboquant b4", "encode", 256)


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="g++ not installed: no CPU emulation")
def test_runs_every_case_with_emulated_kernels(monkeypatch, tune):
    """The whole measuring path (pools, records, every case's encode and decode, bytes moved) on a tiny shape, with the
    CPU emulator standing in for the GPU kernels: catches errors before a GPU session."""
    import _kernel_emulator as ke
    ke.install(monkeypatch, tune, ke.build())
    mod = benchmark_module("test_kernels", monkeypatch)
    monkeypatch.setattr(mod.harness, "POOL", 2)
    for label, (method, _kw) in mod.CASES.items():
        for op in ("encode", "decode"):
            bm = Benchmark()
            with mx.stream(mx.cpu):
                mod.test_kernels(bm, _bench(mod), None, label, op, 8 * 64)
            e = bm.extra_info
            assert (e["suite"], e["arm"], e["op"], e["vectors"]) == ("kernels", label, op, 512), e
            xb = 512 * 128 * 2
            assert e["x_bytes"] == xb and e["moved_bytes"]["fp16 copy"] == 2 * xb, e
            rec = e["moved_bytes"]["ours"] - (xb if op == "encode" else 4 * 512 * 128)
            assert 0 < rec < xb, (label, op, rec)          # a record smaller than x in fp16
            assert set(e["x_GBps"]) == {"ours", "fp16 copy", "mx.quantize"}, e


def test_kernels_table_renders_gb_per_s_and_ratios():
    e = {"suite": "kernels", "arm": "turboquant b4", "op": "encode", "vectors": 262144, "median_s": 2e-4,
         "ratios": {"fp16 copy": 1.5, "mx.quantize": 0.5}, "ratio_iqr": {"fp16 copy": 0.1, "mx.quantize": 0.05},
         "x_GBps": {"ours": 335.5, "fp16 copy": 503.3, "mx.quantize": 167.8},
         "moved_GBps": {"ours": 420.0, "fp16 copy": 1006.6, "mx.quantize": 210.0}}
    run = {"datetime": "2026-12-04T00:00:00", "benchmarks": [{"options": {}, "stats": {"median": 2e-4}, "extra_info": e}],
           "veloxquant": {"device": {"name": "G", "type": "gpu"}, "bands": {"kernels": 0.5}}}
    lines = bench_render.render(run, "k.json")
    row = next(x for x in lines if x.startswith("| encode | 262144 | turboquant b4"))
    assert "**1.50** (0.10)" in row and "**0.50** (0.05)" in row, row
    assert "336 / 503 / 168" in row and "420 / 1007 / 210" in row, row
    assert any("gate band +50%" in x for x in lines), lines


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


def test_kernel_check_fails_a_run_with_any_step_not_passed():
    """tools/dev/kernel_check.py not_ok: the steps that make the command exit 1 (a timed-out job's cells never ran)."""
    from veloxquant.tools.dev import kernel_check as kc
    ok = {"compile": {"result": {"encode/kivi/float16": {"ok": True, "differing_bytes": {"codes": 0}}},
                      "s": 1.0},
          "parallel": {"gpu-tests": {"rc": 0, "s": 1.0}, "thorough-kivi": {"rc": 0, "s": 2.0}},
          "bench": {"rc": 0, "s": 3.0}}
    log = {"steps": ok, "conformance": {"passed": 5, "failed": 0, "error": 0}}
    assert kc.not_ok(log) == [], f"not_ok({log}) = {kc.not_ok(log)}, expected none"
    bad = {"compile": {"result": {"encode/kivi/float16": {"ok": True, "differing_bytes": {"codes": 3}},
                                  "decode/kivi": {"ok": False}}, "s": 1.0},
           "parallel": {"gpu-tests": {"rc": 0, "s": 1.0}, "thorough-kivi": {"rc": "timeout", "s": 330.0}},
           "bench": {"rc": 2, "s": 3.0}}
    log = {"steps": bad, "conformance": {"passed": 5, "failed": 1, "error": 0}}
    assert kc.not_ok(log) == ["compile encode/kivi/float16", "compile decode/kivi", "thorough-kivi (rc timeout)",
                              "bench (rc 2)", "conformance (1 failed, 0 errors)"], f"not_ok: {kc.not_ok(log)}"
