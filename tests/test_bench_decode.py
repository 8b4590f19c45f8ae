"""The decode-step and generate benchmarks' arms (benchmarks/test_decode_step.py, test_generate.py; tools/bench/arms.py),
run in-process on the CPU at a toy size with a stand-in for pytest-benchmark's fixture (plumbing, not a timing): an arm
named with --bench-arms runs with its tuning knobs in effect for its own steps only, records no shipped cache settings,
and replaces the default arms; bad names are usage errors; knobs reach the cached launch plans."""
from __future__ import annotations

import types

import mlx.core as mx
import pytest

from veloxquant.tools.bench import arms as bench_arms
from _bench_util import Benchmark, benchmark_module

pytest.importorskip("mlx_lm")


def _bench(h, arms, suite):
    sizes = {k: dict(v) for k, v in h.SIZES["cpu"].items()}
    sizes[suite].update(rounds=2, warmup=0, layers=1)
    return types.SimpleNamespace(device="cpu", sizes=sizes, named_arms=list(arms), gate=lambda *a: None)


@pytest.mark.parametrize("base", ["turboquant b4", "keys turboquant b4 + values turboquant b2"])
@pytest.mark.parametrize("suite", ["test_decode_step", "test_generate", "test_batch_generate"])
def test_an_arm_with_knobs_sets_them_for_its_steps_only(monkeypatch, suite, base):
    """--bench-arms "turboquant b4 [FUSE_COMBINE=1, DEVICE_COUNTS=0]": ours' steps (and the fill of its caches) run
    under those knobs, fp16's under the defaults, nothing is left changed; the arm records no `cache` settings (the
    quality recommendation must not take an A/B arm for the shipped configuration)."""
    from veloxquant.accelerated import tuning
    from veloxquant.accelerated.cache import VeloxKVCache
    seen = []
    real = VeloxKVCache.update_and_fetch

    def spy(self, keys, values):
        seen.append((tuning.current().fuse_combine, tuning.current().device_counts))
        return real(self, keys, values)
    monkeypatch.setattr(VeloxKVCache, "update_and_fetch", spy)
    batches = []       # (knobs, ours) of each batch_generate call: the batch caches are not VeloxKVCaches
    real_run = bench_arms.batch_run

    def run_spy(model, prompts, tokens, caches):
        ours = caches is not None and isinstance(caches[0][0], VeloxKVCache)
        batches.append(((tuning.current().fuse_combine, tuning.current().device_counts), ours))
        return real_run(model, prompts, tokens, caches)
    monkeypatch.setattr(bench_arms, "batch_run", run_spy)
    mod = benchmark_module(suite, monkeypatch)
    arm = f"{base} [FUSE_COMBINE=1, DEVICE_COUNTS=0]"
    bm = Benchmark()
    name = suite.removeprefix("test_")
    with mx.stream(mx.cpu):
        try:
            getattr(mod, suite)(bm, _bench(mod.harness, [arm], name), None, arm,
                                (32, 2) if name == "batch_generate" else 32)
        except pytest.skip.Exception as e:      # an arm named with --bench-arms must run
            pytest.fail(f"{suite} skipped the named arm {arm!r}: {e}")
    assert seen and set(seen) == {(True, False)}, seen
    if name == "batch_generate":
        assert {ours for _, ours in batches} == {True, False}, batches
        assert all(k == ((True, False) if ours else (False, True)) for k, ours in batches), batches
    assert tuning.current() == tuning.DEFAULT
    assert bm.extra_info["arm"] == arm and "cache" not in bm.extra_info, bm.extra_info
    assert mod.harness.cache_settings("turboquant b4") == {"cache": {"method": "turboquant", "bits": 4}}


def test_named_arms_replace_the_default_ones(monkeypatch):
    mod = benchmark_module("test_decode_step", monkeypatch)
    h = mod.harness
    named = ["turboquant b4", "turboquant b4 [FUSE_COMBINE=1]"]
    assert h.suite_arms(mod.ARMS, {}, False, named) == named
    assert h.suite_arms(mod.ARMS, {"keys x": {}}, False, named) == [*named, "keys x"]
    assert h.suite_arms(mod.ARMS, {}, False) == mod.ARMS
    h.skip_unless_measured("cpu", "decode_step", "turboquant_prod b4", asked=named + ["turboquant_prod b4"])
    with pytest.raises(pytest.skip.Exception, match="--device gpu only"):
        h.skip_unless_measured("cpu", "decode_step", "turboquant_prod b4", asked=named)


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


@pytest.mark.parametrize("names, error", [(["turboquant b4", "rabitq [TC_CODES=1]"], None),
                                          (["keys turboquant b3 + values turboquant b2",
                                            "keys turboquant b3 + values turboquant b2 [TC_CODES=0]"], None),
                                          (["keys turboquant b9 + values turboquant b2"], "unknown arm"),
                                          (["nope"], "unknown arm"), (["fp16 KVCache"], "every arm's baseline"),
                                          (["turboquant b4 [NOPE=1]"], "arm")])
def test_bench_arms_option_checks_its_names(monkeypatch, names, error):
    conf = benchmark_module("conftest", monkeypatch)
    config = types.SimpleNamespace(getoption=lambda k: names if k == "--bench-arms" else None)
    if error is None:
        assert conf._named_arms(config) == names
    else:
        with pytest.raises(pytest.UsageError, match=error):
            conf._named_arms(config)


@pytest.mark.parametrize("told", [None, "abc1234"])
def test_a_told_commit_names_the_tree_in_the_json(monkeypatch, told):
    """VELOXQUANT_GIT (the GPU machine's tree, whose .git is stale) replaces pytest-benchmark's commit_info; unset,
    pytest-benchmark's own stays."""
    conf = benchmark_module("conftest", monkeypatch)
    monkeypatch.setattr(conf, "_meta", lambda config: {"m": 1})
    if told:
        monkeypatch.setenv("VELOXQUANT_GIT", told)
    else:
        monkeypatch.delenv("VELOXQUANT_GIT", raising=False)
    out = {"commit_info": {"id": "0123456789abcdef", "dirty": True}}
    conf.pytest_benchmark_update_json(None, [], out)
    assert out["veloxquant"] == {"m": 1}
    assert out["commit_info"] == ({"id": told, "dirty": False, "source": "VELOXQUANT_GIT"} if told
                                  else {"id": "0123456789abcdef", "dirty": True}), out["commit_info"]
