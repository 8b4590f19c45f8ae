"""The benchmark gate's logic (benchmarks/harness.py) and tools/bench/render.py, without timing anything: the
paired ratios under a scripted clock, the band check, and docs/benchmarks.md's section against the saved runs."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import types

import pytest

from veloxquant.tools.bench import render as bench_render

ROOT = pathlib.Path(__file__).resolve().parent.parent
BASELINES = sorted((ROOT / "benchmarks" / "baselines").glob("*.json"))


def _harness():
    spec = importlib.util.spec_from_file_location("bench_harness", ROOT / "benchmarks" / "harness.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Clock:
    """A timer that moves only when an arm runs: each arm advances it by its cost."""
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _FakeBenchmark:
    """What paired() uses of pytest-benchmark's fixture: pedantic (setup / target / teardown, warm-up rounds not
    recorded), _timer, stats.stats.data, extra_info."""
    def __init__(self, clock):
        self._timer = clock
        self.extra_info = {}
        self.stats = None

    def pedantic(self, target, setup, teardown, rounds, warmup_rounds):
        data = []
        for r in range(warmup_rounds + rounds):
            args, kwargs = setup()
            t0 = self._timer()
            target(*args, **kwargs)
            if r >= warmup_rounds:
                data.append(self._timer() - t0)
            teardown(*args, **kwargs)
        self.stats = types.SimpleNamespace(stats=types.SimpleNamespace(data=data))


def test_paired_ratio_is_ours_over_the_baseline_of_the_same_round():
    h = _harness()
    clock = _Clock()
    order = []

    def arm(name, cost):
        def run(i):
            order.append(name)
            clock.now += cost(i)
        return run
    # per input: (ours, baseline) = (1, 1), (6, 2), (6, 6): the third round is a slow moment of the host for both
    # arms. Per-round ratios 1, 3, 1: median 1; the ratio of the arms' medians would be 6 / 2 = 3
    costs = {0: (1.0, 1.0), 1: (1.0, 1.0), 2: (6.0, 2.0), 3: (6.0, 6.0)}
    ours = arm("ours", lambda i: costs[i][0])
    base = arm("base", lambda i: costs[i][1])
    b = _FakeBenchmark(clock)
    res = h.paired(b, ours, {"fp16": base}, rounds=3, warmup=1)
    assert res["ratios"]["fp16"] == pytest.approx(1.0)
    assert res["baseline_median_s"]["fp16"] == pytest.approx(2.0) and res["median_s"] == pytest.approx(6.0)
    assert b.extra_info["ratios"] == res["ratios"]
    # the baseline goes first on even rounds and last on odd ones
    assert order[:6] == ["base", "ours", "ours", "base", "base", "ours"]


def test_paired_times_an_expensive_baseline_every_kth_round_only():
    h = _harness()
    clock = _Clock()
    calls = []

    def ref(i):
        calls.append(i)
        clock.now += 10.0
    res = h.paired(_FakeBenchmark(clock), lambda i: setattr(clock, "now", clock.now + 1.0),
                   {"fp16": lambda i: setattr(clock, "now", clock.now + 2.0), "reference": ref},
                   rounds=10, warmup=2, every={"reference": 5})
    assert len(calls) == 2                     # rounds 0 and 5 after the warm-up, none in the warm-up
    assert res["ratios"] == pytest.approx({"fp16": 0.5, "reference": 0.1})


def test_paired_counts_rounds_on_a_slowed_host_and_gives_the_ratio_over_the_others(monkeypatch):
    h = _harness()
    clock = _Clock()
    # the host probe per round (1 warm-up + 6 timed): rounds 2 and 4 at twice the fastest; ours costs 3 there
    probes = iter([10.0, 10.0, 10.5, 20.0, 10.2, 21.0, 10.1])
    monkeypatch.setattr(h, "round_probe", lambda: next(probes))
    monkeypatch.setattr(h, "_FASTEST", [10.0])
    state = {"r": 0}

    def ours(i):
        clock.now += 3.0 if state["r"] in (3, 5) else 1.0
        state["r"] += 1

    def base(i):
        clock.now += 1.0
    b = _FakeBenchmark(clock)
    res = h.paired(b, lambda i: ours(i), {"fp16": base}, rounds=6, warmup=1)
    assert b.extra_info["slow_host_rounds"] == 2, f"paired: slow rounds {b.extra_info['slow_host_rounds']}, not 2"
    assert b.extra_info["host_round_us"] == [10.0, 10.5, 20.0, 10.2, 21.0, 10.1]
    # all rounds: ratios 1, 1, 3, 1, 3, 1 (median 1); the steady ones 1, 1, 1, 1
    assert res["ratios"]["fp16"] == pytest.approx(1.0)
    assert b.extra_info["ratios_steady"] == pytest.approx({"fp16": 1.0})
    # more slowed rounds than steady ones: the median moves, the steady ratio does not
    probes = iter([10.0] + [20.0] * 4 + [10.0] * 2)
    monkeypatch.setattr(h, "round_probe", lambda: next(probes))
    state["r"] = -100       # (ours costs 1 in every round here, so the steady ratio is 1 whatever the rounds)
    res = h.paired(_FakeBenchmark(clock), lambda i: ours(i), {"fp16": lambda i: base(i)}, rounds=6, warmup=1)
    assert res["slow_host_rounds"] == 4 and res["ratios_steady"] == {}     # (2 steady rounds: too few)


def test_render_marks_a_cell_whose_rounds_ran_on_a_slowed_host():
    def run(slow: int) -> dict:
        e = {"suite": "generate", "arm": "turboquant b4", "context": 32768, "layers": 4, "shape": "llama3-8b",
             "tokens": 64, "rounds": 8, "ratios": {"fp16": 0.9}, "ratio_iqr": {"fp16": 0.1}, "tokens_per_s": 900.0,
             "fp16_tokens_per_s": 800.0, "slow_host_rounds": slow, "slow_host_factor": 1.25,
             "ratios_steady": {"fp16": 0.75}}
        return {"benchmarks": [{"name": "t", "extra_info": e, "options": {}}], "veloxquant": {}}
    text = "\n".join(bench_render.render(run(3), "x.json"))
    assert "0.90** (0.10) †" in text and "generate turboquant b4 32k: 0.75 (÷ fp16), 3 of 8 rounds slowed" in text, \
        f"render: 3 of 8 slowed rounds not marked:\n{text}"
    text = "\n".join(bench_render.render(run(2), "x.json"))     # a quarter: not marked
    assert "†" not in text, f"render: 2 of 8 slowed rounds marked:\n{text}"


def test_check_fails_only_beyond_the_band():
    h = _harness()
    base = {"b::t[x]": {"fp16": 1.0, "reference": 0.5}}
    assert h.check("b::t[x]", "decode_step", {"fp16": 1.0 + 0.99 * h.BANDS["decode_step"]}, base) == []
    bad = h.check("b::t[x]", "decode_step", {"fp16": 1.0 + 1.01 * h.BANDS["decode_step"], "reference": 0.4}, base)
    assert len(bad) == 1 and "ours / fp16" in bad[0] and "noise band" in bad[0]
    assert h.check("b::t[x]", "ops", {"reference": 0.56}, base, band=0.1) == ["b::t[x]: ours / reference = 0.560, "
                                                                               "baseline 0.500: +12%, beyond the 10% "
                                                                               "noise band"]
    assert h.check("b::new", "ops", {"fp16": 9.0}, base) == []        # no baseline yet: not a regression


def test_gate_keys_name_what_was_measured_not_the_test_id(tmp_path):
    """The gate compares benchmark by benchmark on (suite, arm, op, context, batch): the same arm at two contexts or
    two batch sizes are two keys, and a run whose pytest ids differ (other --bench-contexts) still finds its
    baseline."""
    h = _harness()
    rows = [{"fullname": "x", "extra_info": {"suite": "decode_step", "arm": "a", "context": c, "ratios": {"fp16": r}}}
            for c, r in ((4096, 1.0), (32768, 2.0))]
    rows += [{"fullname": "x", "extra_info": {"suite": "batch_generate", "arm": "a", "context": 8192, "batch": n,
                                              "ratios": {"fp16": float(n)}}} for n in (4, 8)]
    rows.append({"fullname": "y", "extra_info": {"suite": "ops", "arm": "a", "op": "encode", "tokens": 9,
                                                 "ratios": {"mx.quantize": 3.0}}})
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"benchmarks": rows}))
    got = h.load_ratios(path)
    assert got == {"decode_step[a, context 4096]": {"fp16": 1.0}, "decode_step[a, context 32768]": {"fp16": 2.0},
                   "batch_generate[a, context 8192, batch 4]": {"fp16": 4.0},
                   "batch_generate[a, context 8192, batch 8]": {"fp16": 8.0},
                   "ops[a, op encode]": {"mx.quantize": 3.0}}
    key = h.gate_key({"suite": "decode_step", "arm": "a", "context": 32768, "ratios": {"fp16": 9.0}})
    assert h.check(key, "decode_step", {"fp16": 2.0 * 1.5}, got) != []       # beyond the 35 % band of 2.0
    assert h.check(key, "decode_step", {"fp16": 1.2}, got) == []


def test_slow_update_mutant_rejects_a_bad_value(monkeypatch):
    h = _harness()
    monkeypatch.setenv(h.SLOW_UPDATE_ENV, "fast")
    with pytest.raises(ValueError, match=h.SLOW_UPDATE_ENV):
        h.slow_update_mutant()


@pytest.mark.skipif(not BASELINES, reason="no saved benchmark runs in benchmarks/baselines")
def test_saved_runs_carry_ratios_and_docs_are_rendered_from_them(capsys):
    h = _harness()
    for p in BASELINES:
        data = json.loads(p.read_text())
        assert data["veloxquant"]["command"].startswith("pytest benchmarks")
        suites = {b["extra_info"]["suite"] for b in data["benchmarks"]}
        core = {"decode_step", "generate", "cold_start", "ops"}
        assert core <= suites <= core | {"batch_generate"}, p
        assert all(h.load_ratios(p).values()), f"{p}: a benchmark without ratios"
    assert bench_render.main(["--check", str(ROOT / "docs" / "benchmarks.md")]) == 0, capsys.readouterr().err
    runs = bench_render.default_runs()
    assert runs[:len(BASELINES)] == BASELINES and all(bench_render.is_saved_run(p) for p in runs), runs


@pytest.mark.skipif(not BASELINES, reason="no saved benchmark runs in benchmarks/baselines")
def test_render_check_fails_on_a_hand_edit_or_a_missing_run(tmp_path, capsys):
    """docs/benchmarks.md is the rendering, all of it: a hand edit anywhere (below the tables too) fails --check, and
    so does a page rendered from fewer runs than it shows."""
    page = tmp_path / "benchmarks.md"
    assert bench_render.main(["--write", str(page)]) == 0
    assert bench_render.main(["--check", str(page)]) == 0
    text = page.read_text()
    page.write_text(text + "\n## Older results\n\nhand-written\n")
    assert bench_render.main(["--check", str(page)]) == 1
    assert "differs from a rendering" in capsys.readouterr().err
    page.write_text(text)
    assert bench_render.main([str(BASELINES[0]), "--check", str(page)]) == (0 if len(
        bench_render.default_runs()) == 1 else 1)


def test_mlx_q_arm_is_skipped_with_the_backends_reason_where_it_cannot_attend(monkeypatch):
    """mlx-lm's QuantizedKVCache arms are probed once with a small step: where the backend raises (MLX's CUDA
    quantized_matmul for these shapes), the benchmark skips with that message before paying for its prefill."""
    h = _harness()
    arm = h.MLX_Q[0]

    def broken(name, layers):
        raise RuntimeError("[quantized_matmul] No implementation for problem shape: 1x65x128x32")
    monkeypatch.setattr(h.bench_arms, "make", broken)
    with pytest.raises(pytest.skip.Exception,
                       match=r"does not run on this device \(RuntimeError: \[quantized_matmul\]"):
        h.skip_unless_mlx_q_works(arm)
    h.skip_unless_mlx_q_works("turboquant b4")        # ours: never probed
    monkeypatch.undo()
    h._Q_PROBED.clear()
    h.skip_unless_mlx_q_works(arm)                    # where it runs (MLX's CPU backend): measured


def test_gpu_matrix_has_every_method_at_its_default_bits_with_window_0_and_32():
    """Issue 29's table: with --device gpu the decode-step and generate benchmarks measure every method of the spec
    at its default bits (formats.toml) with window 0 and with window 32, the mixed keys turboquant 3 / values kivi 2
    arm, and mlx-lm's q4 / q8 caches; the batch benchmark every method."""
    from veloxquant import spec
    h = _harness()
    for suite in ("decode_step", "generate", "batch_generate"):
        measured = h.GPU_SUITE_ARMS[suite]
        found = {}
        for name in measured:
            s = h.ALL_ARMS.get(name)
            if not s or s.get("method") is None:
                continue
            p = spec.Params(s["method"], **{k: s[k] for k in ("bits", "bits2", "group_size", "window")
                                            if k in s}).resolved()
            d = spec.Params(s["method"]).resolved()
            found.setdefault(s["method"], set()).add((p.bits == d.bits and p.bits2 == d.bits2, p.window))
        assert set(found) == set(spec.METHODS), suite
        if suite != "batch_generate":
            missing = {m: w for m in spec.METHODS for w in (0, 32) if (True, w) not in found[m]}
            assert not missing, f"{suite}: no arm at the default bits with these windows: {missing}"
            assert set(h.MLX_Q) <= set(measured)
        # (the mixed pair at its recommended windows; the decode step and generate also with one window 32)
        mixed = [n for n in measured if h.ALL_ARMS.get(n, {}).get("key_method") == "turboquant"]
        assert {(h.ALL_ARMS[n]["key_bits"], h.ALL_ARMS[n]["value_method"], h.ALL_ARMS[n]["value_bits"])
                for n in mixed} == {(3, "kivi", 2)}, (suite, mixed)
        assert "keys turboquant b3 + values kivi b2" in mixed, (suite, mixed)
