"""tools/bench/decode.py's layer suite on the CPU at a toy size (a benchmark's plumbing, not a timing): every row has
the step alone, the pipelined step and the host build (the GPU clock only where there is CUDA), the build is part of
the step, and the table renders old runs (no pipelined / build fields) and new ones."""
from __future__ import annotations

import mlx.core as mx
import pytest

from veloxquant.tools.bench import arms as bench_arms
from veloxquant.tools.bench import decode as bd

pytest.importorskip("mlx_lm")


def test_layer_suite_rows_and_table():
    with mx.stream(mx.cpu):
        rows = bd.layer_suite([64], layers=1, steps=2, arms=["fp16 KVCache", "turboquant b4"], log=lambda *a: None)
    assert [r["arm"] for r in rows] == ["fp16 KVCache", "turboquant b4"], rows
    for r in rows:
        for f in ("layer_s", "pipelined_layer_s", "build_layer_s", "vs_fp16", "pipelined_vs_fp16"):
            assert f in r and r[f] > 0, (r["arm"], f, r.get(f))
        assert r["build_layer_s"] < r["layer_s"], (r["arm"], r["build_layer_s"], r["layer_s"])
        assert r["pipelined_transient_peak_bytes"] >= 0, r
        # the GPU clock (tools/bench/gpu_clock.py) is CUDA's: on the CPU a row says why it has no GPU time
        assert "gpu_layer_s" not in r and r["gpu_clock"], r
    # what the pipelined peak column is for (docs/decode-step-analysis.md, eighth pass): mlx-lm's KVCache copies its
    # buffers when the step in flight still holds them, so its pipelined transient peak exceeds its whole cache;
    # ours stores in place
    # the steady state of a pipelined sample (the spacing of its steps' completions after the first): present with
    # PIPE >= 3 steps
    for r in rows:
        assert r["pipe"] == bd.PIPE >= 3 and 0 < r["pipelined_steady_layer_s"], r
        assert r["pipelined_steady_vs_fp16"] > 0, r
    fp16, ours = rows
    assert fp16["pipelined_transient_peak_bytes"] >= fp16["bytes_per_layer"] > 10 * fp16["transient_peak_bytes"], fp16
    assert ours["pipelined_transient_peak_bytes"] < 2 * ours["transient_peak_bytes"] + ours["bytes_per_layer"], ours
    old = dict(rows[1])
    for f in ("pipelined_layer_s", "pipelined_vs_fp16", "build_layer_s", "pipelined_transient_peak_bytes", "pipe",
              "pipelined_steady_layer_s", "pipelined_steady_vs_fp16"):
        del old[f]
    res = {"device": {"name": "cpu", "type": "cpu"}, "versions": {}, "date": "2026-12-01T00:00:00",
           "command": "test", "copy_bytes_per_s": 1e9, "layer": rows + [old]}
    table = [ln for ln in bd.render(res, "x.json") if ln.startswith("| 64 ")]
    assert len(table) == 3 and all(ln.count("|") == 15 for ln in table), table
    assert "— | —" in table[2] and table[2].count("—") == 5, table[2]
    assert all("(steady " in ln for ln in table[:2]) and "(steady " not in table[2], table
    gpu = dict(rows[1], gpu_layer_s=2e-5, gpu_vs_fp16=0.5)
    (line,) = [ln for ln in bd.render(dict(res, layer=[gpu]), "x.json") if ln.startswith("| 64 ")]
    assert "| 20.0 µs | 0.50 |" in line, line


def test_layer_suite_with_a_batch(monkeypatch):
    """--layer-batch: B sequences of different lengths merged into each arm's batch cache (fp16: mlx-lm's
    BatchKVCache; ours: the B-row cache, or one cache per sequence with SHARED=0), each step attended with the
    batch's mask; the rows say their batch, the table shows it."""
    seen = []
    real = bench_arms.step

    def spy(caches, q, k, v):
        seen.append((type(caches[0]).__name__, q.shape[0]))
        return real(caches, q, k, v)
    monkeypatch.setattr(bench_arms, "step", spy)
    with mx.stream(mx.cpu):
        rows = bd.layer_suite([40], layers=2, steps=1, arms=["fp16 KVCache", "turboquant b4", "turboquant b4 [SHARED=0]"],
                              log=lambda *a: None, batch=3)
    assert [(r["arm"], r["batch"]) for r in rows] == [("fp16 KVCache", 3), ("turboquant b4", 3),
                                                     ("turboquant b4 [SHARED=0]", 3)], rows
    assert {n for n, b in seen} == {"BatchKVCache", "SharedBatchVeloxKVCache", "BatchVeloxKVCache"} and \
        {b for _, b in seen} == {3}, set(seen)
    assert all(r["layer_s"] > 0 and r["vs_fp16"] > 0 for r in rows), rows
    res = {"device": {"name": "cpu", "type": "cpu"}, "versions": {}, "date": "2026-12-01T00:00:00",
           "command": "test", "copy_bytes_per_s": 1e9, "layer": rows}
    assert len([ln for ln in bd.render(res, "x.json") if ln.startswith("| 40 × 3 |")]) == 3


def test_an_arm_with_knobs_sets_them_for_its_steps_only(monkeypatch):
    from veloxquant.accelerated import tuning
    seen = []
    real = bench_arms.step

    def spy(caches, q, k, v):
        seen.append((type(caches[0]).__name__, tuning.current().fuse_combine, tuning.current().device_counts))
        return real(caches, q, k, v)
    monkeypatch.setattr(bench_arms, "step", spy)
    arm = "turboquant b4 [FUSE_COMBINE=1, DEVICE_COUNTS=0]"
    with mx.stream(mx.cpu):
        rows = bd.layer_suite([32], layers=1, steps=1, arms=["fp16 KVCache", arm], log=lambda *a: None)
    assert [r["arm"] for r in rows] == ["fp16 KVCache", arm], rows
    assert {s for s in seen if s[0] == "KVCache"} == {("KVCache", False, True)}, seen
    assert {s for s in seen if s[0] != "KVCache"} == {("VeloxKVCache", True, False)}, seen
    assert tuning.current() == tuning.DEFAULT


@pytest.mark.parametrize("name", ["turboquant b4 [NOPE=1]", "turboquant b4 [FUSE_COMBINE=x]", "fp16 KVCache [FUSE_COMBINE=0]",
                                  "nope [FUSE_COMBINE=0]"])
def test_bad_arm_names_are_errors(name):
    with pytest.raises(ValueError, match="arm"):
        bench_arms.arm_names([name])


def test_launch_knobs_reach_cached_plans(monkeypatch):
    """The attention plan and the append launch are cached per shape; an arm's knobs must still give its own
    plans (no cache is cleared between arms): the combine's threads, the tensor-core loop's bounds and
    prefetch, and the append's role split."""
    from _attention_util import packed

    from veloxquant import spec
    from veloxquant.accelerated.kernels import append as kapp
    from veloxquant.accelerated.kernels import attention as katt
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    p = spec.Params("turboquant", role="k", window=0, seed=1, layer=0, bits=4).resolved()
    x = mx.random.normal((1, 2, 40, 128), key=mx.random.key(0)).astype(mx.float16)
    k = packed(x, p)
    q = mx.random.normal((1, 8, 1, 128), key=mx.random.key(1)).astype(mx.float16)
    plans = {}
    for arm in ("turboquant b4", "turboquant b4 [COMBINE_THREADS=128, TC_MIN_BLOCKS=3, TC_PREFETCH=1]",
                "turboquant b4 [TENSOR_CORES=0]"):
        with bench_arms.knobs(arm):
            plans[arm] = katt.launch_plan(q, k, k, 0.1)
    a, b, c = plans.values()
    assert (a.combine_threads, a.key[4:6], dict(a.partial_template)["PF"]) == (512, (True, 2), 2), a
    assert (b.combine_threads, b.key[4:6], dict(b.partial_template)["PF"]) == (128, (True, 3), 1), b
    assert c.key[4:6] == (False, 0) and c.combine_template == a.combine_template, c
    grids = {}
    monkeypatch.setattr(kapp, "_kernel", lambda *a: None)       # no GPU backend needed for the launch shape
    kapp._static_for.cache_clear()
    try:
        for arm in ("turboquant b4 [ROLES_APART=1]", "turboquant b4 [ROLES_APART=0]"):
            with bench_arms.knobs(arm):
                grids[arm] = kapp._static(p, p, 1, 8, 1, 128, mx.float16, mx.float16)[0]
    finally:
        kapp._static_for.cache_clear()
    assert list(grids.values()) == [(2 * 8 * 32, 1, 1), (8 * 32, 1, 1)], grids


def test_e2e_rounds_give_medians_and_keep_failures():
    """The e2e suite's rounds: per (context, arm) the median tokens/s and prefill, every round listed, a failed
    round said (not dropped), an arm with no good round keeps its error, vs_fp16 from the medians."""
    rows = [{"context": 8, "arm": "fp16 KVCache", "layers": 2, "tokens": 3, "prefill_s": 1.0, "tokens_per_s": 10.0},
            {"context": 8, "arm": "x", "layers": 2, "tokens": 3, "prefill_s": 2.0, "tokens_per_s": 30.0},
            {"context": 8, "arm": "fp16 KVCache", "layers": 2, "tokens": 3, "prefill_s": 3.0, "tokens_per_s": 20.0},
            {"context": 8, "arm": "x", "error": "RuntimeError: boom"},
            {"context": 8, "arm": "fp16 KVCache", "layers": 2, "tokens": 3, "prefill_s": 2.0, "tokens_per_s": 40.0},
            {"context": 8, "arm": "y", "error": "ValueError: bad"}]
    out = {r["arm"]: r for r in bd._e2e_medians(rows)}
    assert out["fp16 KVCache"]["tokens_per_s"] == 20.0 and out["fp16 KVCache"]["prefill_s"] == 2.0, out
    assert out["fp16 KVCache"]["rounds_tokens_per_s"] == [10.0, 20.0, 40.0], out
    assert out["x"]["vs_fp16"] == 1.5 and out["x"]["failed_rounds"] == ["RuntimeError: boom"], out["x"]
    assert out["y"] == {"context": 8, "arm": "y", "error": "ValueError: bad"}, out["y"]


TINY = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            vocab_size=200)


def test_batch_suite_rows_and_table():
    """The batch suite runs mlx_lm.batch_generate through each arm's caches (ours really attend: their attention
    calls are counted, fp16's are mlx-lm's own), one row per context, batch size and arm, and renders a table."""
    with mx.stream(mx.cpu):
        rows = bd.batch_suite([40], [1, 3], n_layers=2, n_tokens=3,
                              arms=["fp16 KVCache", "turboquant b4", "turboquant b4 [SHARED=0]"],
                              log=lambda *a: None, rounds=1, shape=TINY)
    assert [(r["batch"], r["arm"]) for r in rows] == [(b, a) for b in (1, 3) for a in (
        "fp16 KVCache", "turboquant b4", "turboquant b4 [SHARED=0]")], rows
    for r in rows:
        assert r["generation_tokens_per_s"] > 0 and r["prompt_tokens_per_s"] > 0 and r["peak_memory_bytes"] > 0, r
        assert len(r["rounds_generation_tokens_per_s"]) == 1 and r["vs_fp16"] > 0, r
    fp16, shared, per_seq = rows[3:]
    assert fp16["paths"] == {}, fp16
    # every layer attends at each generated token (and the prompt's last chunk): the B-row cache (batch_shared) once
    # per layer for the batch, BatchVeloxKVCache (SHARED=0) once per layer and sequence
    assert 2 * 3 <= shared["paths"]["attend"] < 2 * 3 * 3, shared
    assert per_seq["paths"]["attend"] >= 2 * 3 * 3, per_seq
    res = {"device": {"name": "cpu", "type": "cpu"}, "versions": {}, "date": "2026-12-01T00:00:00",
           "command": "test", "copy_bytes_per_s": 1e9, "layer": [], "batch": rows}
    table = [ln for ln in bd.render(res, "x.json") if ln.startswith("| 40 ")]
    assert len(table) == 6 and all(ln.count("|") == 10 for ln in table), table


def test_batch_plot_marks_failed_arms(tmp_path):
    """plot_batch draws one panel per context from the batch rows (a failed arm marked where it failed) and makes
    nothing for a run without batch rows."""
    pytest.importorskip("matplotlib")
    ok = lambda t, b, arm, tps: {"context": t, "batch": b, "arm": arm, "generation_tokens_per_s": tps}  # noqa: E731
    rows = [ok(4096, 1, "fp16 KVCache", 700.0), ok(4096, 4, "fp16 KVCache", 1600.0), ok(4096, 4, "turboquant b4", 1300.0),
            ok(32768, 4, "turboquant b4", 1500.0), {"context": 32768, "batch": 4, "arm": "fp16 KVCache",
                                                    "error": "RuntimeError: out of memory"}]
    res = {"device": {"name": "cpu"}, "date": "2026-12-01T00:00:00", "batch": rows}
    out = bd.plot_batch(res, tmp_path / "b.png")
    assert out == tmp_path / "b.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    w = matplotlib.image.imread(out).shape[1]
    single = bd.plot_batch({**res, "batch": [r for r in rows if r["context"] == 4096]}, tmp_path / "one.png")
    assert matplotlib.image.imread(single).shape[1] < w, "one panel per context"
    assert bd.plot_batch({**res, "batch": []}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
