"""pytest options of the benchmarks: the device, the contexts, the gate against a saved baseline, the JSON saved after
each benchmark, and what the saved JSON records (command, device, versions, sizes, bands, warm-up) for
tools/bench/render.py."""
from __future__ import annotations

import json
import os
import pathlib
import platform
import time

import pytest

import harness


def pytest_addoption(parser):
    g = parser.getgroup("veloxquant benchmarks")
    # conformance/conftest.py defines the same --device (cpu | gpu, default MLX's): when it was loaded first, use its
    defined = {n for grp in [parser._anonymous, *parser._groups] for o in grp.options for n in o.names()}
    if "--device" not in defined:
        g.addoption("--device", choices=["cpu", "gpu"], default=None,
                    help="MLX device to measure on (default: MLX's default device); sizes follow it")
    g.addoption("--bench-gate", default=None, metavar="JSON",
                help="fail each benchmark whose ratio to its baseline arm exceeds this saved run's (a pytest-benchmark "
                     "JSON of these benchmarks, e.g. benchmarks/baselines/cpu.json) by more than the suite's noise "
                     "band (benchmarks/harness.py BANDS)")
    g.addoption("--bench-band", type=float, default=None, metavar="FRACTION",
                help="one noise band for every suite instead of harness.BANDS (e.g. 0.1)")
    g.addoption("--bench-contexts", type=int, nargs="+", default=None, metavar="TOKENS",
                help="contexts of the decode-step and generate benchmarks, run in this order (all of one context "
                     "before the next; default: the device's size, benchmarks/harness.py SIZES)")
    g.addoption("--bench-batches", nargs="+", default=None, metavar="TOKENSxSEQUENCES",
                help="the batch benchmarks' (prompt length, prompts), e.g. 8192x8 32768x4 (default: the device's "
                     "configs, benchmarks/harness.py SIZES)")
    g.addoption("--bench-kv", nargs="+", default=None, metavar="KEYMETHOD:BITS/VALUEMETHOD:BITS",
                help="add an arm per explicit key/value configuration at window 0 to the decode-step, generate and "
                     "batch benchmarks (every device), e.g. turboquant:3/turboquant:2 turboquant_rvq:2+1/kivi:4; named "
                     "like the mixed arm, 'keys turboquant b3 + values turboquant b2' (tools/bench/kv_arms.py). "
                     "`python -m veloxquant.tools.quality.retrieval_doc --json Q.json ... --bench-kv` prints the "
                     "quality recommendation's")
    g.addoption("--bench-kv-only", action="store_true",
                help="with --bench-kv: the decode-step, generate and batch benchmarks measure those arms alone")
    g.addoption("--bench-arms", nargs="+", default=None, metavar="ARM",
                help="the decode-step, generate and batch benchmarks measure these arms (tools/bench/arms.py: ours, with tuning "
                     "knobs for an A/B in one run, e.g. 'turboquant b4' 'turboquant b4 [FUSE_COMBINE=1]' (the fields "
                     "of accelerated/tuning.py's Tuning, in effect while that arm's caches are filled and stepped), or "
                     "mlx-lm's 'mlx q4 QuantizedKVCache') instead of the device's default arms, each against fp16")
    g.addoption("--bench-partial", default=None, metavar="JSON",
                help="rewrite this file after every benchmark with the run so far (the format of --benchmark-json, "
                     "which pytest-benchmark writes only at the end): a run cut short keeps what it measured")


def _named_arms(config) -> list[str]:
    """--bench-arms' arms, checked (tools/bench/arms.py arm_names: known names, knobs only on ours); the fp16 baseline
    is not an arm of its own."""
    from veloxquant.tools.bench import arms as bench_arms
    raw = config.getoption("--bench-arms") or []
    try:
        names = bench_arms.arm_names(raw) if raw else []
    except ValueError as e:
        raise pytest.UsageError(f"--bench-arms: {e}") from None
    if "fp16 KVCache" in names:
        raise pytest.UsageError("--bench-arms: fp16 KVCache is every arm's baseline, measured in the same rounds")
    return names


def _kv_arms(config) -> dict:
    """{arm name: settings} of --bench-kv's arguments, in their order (kv_arms.kv_arm); a bad one is a usage error."""
    from veloxquant.tools.bench import kv_arms
    raw = config.getoption("--bench-kv") or []
    if config.getoption("--bench-kv-only") and not raw:
        raise pytest.UsageError("--bench-kv-only: give the arms with --bench-kv KEYMETHOD:BITS/VALUEMETHOD:BITS ...")
    out = {}
    for text in raw:
        try:
            name, s = kv_arms.kv_arm(text)
        except ValueError as e:
            raise pytest.UsageError(f"--bench-kv: {e}") from None
        out[name] = s
    return out


class Bench:
    """What a benchmark needs from the session: the device type, its sizes, the gate."""

    def __init__(self, config):
        import mlx.core as mx
        want = config.getoption("--device")
        self.skip = None
        if want == "gpu" and not mx.is_available(mx.gpu):
            self.skip = "--device gpu: this MLX build has no GPU"
        elif want is not None:
            mx.set_default_device(mx.gpu if want == "gpu" else mx.cpu)
        self.device = "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"
        self.sizes = harness.SIZES[self.device]
        gate = config.getoption("--bench-gate")
        self.gate_path = pathlib.Path(gate) if gate else None
        if self.gate_path is not None and not self.gate_path.is_file():
            raise pytest.UsageError(f"--bench-gate: no such file {gate!r}")
        self.baseline = harness.load_ratios(self.gate_path) if self.gate_path else {}
        self.band = config.getoption("--bench-band")
        self.contexts = config.getoption("--bench-contexts")
        if self.contexts is not None and min(self.contexts) < 2:
            raise pytest.UsageError(f"--bench-contexts: contexts must be at least 2 tokens, got {self.contexts}")
        self.kv_arms = _kv_arms(config)
        self.kv_only = config.getoption("--bench-kv-only")
        self.named_arms = _named_arms(config)
        partial = config.getoption("--bench-partial")
        self.partial = pathlib.Path(partial) if partial else None
        self.done = []          # finished benchmarks' records, for --bench-partial
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        self.slow_update = harness.slow_update_mutant()
        self.host = {"start": harness.host_probe()}     # (and "end" at the session's end: pytest_sessionfinish)

        self.batches = [tuple(c) for c in self.sizes["batch_generate"]["configs"]]
        raw = config.getoption("--bench-batches")
        if raw:
            try:
                self.batches = [tuple(int(x) for x in r.lower().split("x")) for r in raw]
                assert all(len(c) == 2 and c[0] >= 2 and c[1] >= 1 for c in self.batches)
            except (ValueError, AssertionError):
                raise pytest.UsageError(f"--bench-batches: expected TOKENSxSEQUENCES (e.g. 8192x8), got {raw}") \
                    from None

    def contexts_of(self, suite: str) -> list[int]:
        return list(self.contexts) if self.contexts else [self.sizes[suite]["context"]]

    def gate(self, request, suite: str, result: dict) -> None:
        """Fails the test when a ratio regressed beyond the band (only with --bench-gate)."""
        if self.gate_path is None:
            return
        key = harness.gate_key(dict(result, suite=suite))
        bad = harness.check(key, suite, result["ratios"], self.baseline, self.band)
        if bad:
            pytest.fail("benchmark gate (" + str(self.gate_path) + "):\n" + "\n".join(bad), pytrace=False)


def pytest_configure(config):
    config._veloxquant_bench = Bench(config)


def pytest_generate_tests(metafunc):
    """`context`: each of the suite's contexts (the module's SUITE)."""
    if "context" in metafunc.fixturenames:
        b = metafunc.config._veloxquant_bench
        metafunc.parametrize("context", b.contexts_of(metafunc.module.SUITE), ids=lambda c: f"ctx{c}")
    if "arm" in metafunc.fixturenames and hasattr(metafunc.module, "ARMS"):     # decode step, generate: + --bench-kv
        b = metafunc.config._veloxquant_bench
        metafunc.parametrize("arm", harness.suite_arms(metafunc.module.ARMS, b.kv_arms, b.kv_only,
                                                                b.named_arms))
    if "vectors" in metafunc.fixturenames:          # the kernels benchmark: the device's sizes
        b = metafunc.config._veloxquant_bench
        metafunc.parametrize("vectors", b.sizes["kernels"]["vectors"], ids=lambda n: f"n{n}")
    if "batch_config" in metafunc.fixturenames:
        b = metafunc.config._veloxquant_bench
        metafunc.parametrize("batch_config", b.batches, ids=lambda c: f"{c[0]}x{c[1]}")


def pytest_collection_modifyitems(config, items):
    b = config._veloxquant_bench
    if b.skip:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=b.skip))
    # every benchmark of one context before the next context's, in --bench-contexts order; then the batches, one
    # (t, B) after the other; the benchmarks without either (cold start, ops) last; each group in collection order
    order = {c: i for i, c in enumerate(b.contexts or [])}
    batches = {c: i for i, c in enumerate(b.batches)}

    def rank(item):
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "context" in params:
            return order.get(params["context"], len(order))
        if "batch_config" in params:
            return len(order) + 1 + batches.get(params["batch_config"], len(batches))
        return len(order) + len(batches) + 2
    items.sort(key=rank)


@pytest.fixture(scope="session")
def bench(pytestconfig) -> Bench:
    return pytestconfig._veloxquant_bench


@pytest.fixture(autouse=True)
def _record_each(request, pytestconfig):
    """Each benchmark's wall time (setup included: prefill, compilation) in its extra_info, for planning a run's
    time; with --bench-partial, the run so far written after each benchmark."""
    t0 = time.perf_counter()
    bm = request.getfixturevalue("benchmark") if "benchmark" in request.fixturenames else None
    yield
    if bm is None or getattr(bm, "stats", None) is None:
        return
    bm.extra_info["test_wall_s"] = round(time.perf_counter() - t0, 2)
    b = pytestconfig._veloxquant_bench
    b.done.append(bm.stats.as_dict(include_data=False, stats=True))
    if b.partial is not None:
        _write_partial(pytestconfig, True)


def _write_partial(config, partial: bool) -> None:
    """--bench-partial's file: the benchmarks finished so far; `partial` False once the session ran to its end."""
    import pytest_benchmark
    b = config._veloxquant_bench
    out = {"datetime": b.started, "version": pytest_benchmark.__version__, "partial": partial,
           "machine_info": _machine(), "commit_info": _told_commit() or {}, "benchmarks": b.done,
           "veloxquant": _meta(config)}
    tmp = b.partial.with_name(b.partial.name + ".tmp")
    tmp.write_text(json.dumps(out, indent=1, default=str))
    os.replace(tmp, b.partial)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)     # (around pytest-benchmark's, which writes --benchmark-json)
def pytest_sessionfinish(session, exitstatus):
    """The host probe again at the end of a run that timed something; a --bench-partial run that ran every selected
    benchmark (passed or failed, not stopped by -x, --maxfail or an interrupt) is whole: its file says so. A run killed
    before this stays marked partial."""
    b = getattr(session.config, "_veloxquant_bench", None)
    if b is not None and b.done:
        b.host["end"] = harness.host_probe()
    yield
    if b is not None and b.done and b.partial is not None \
            and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) \
            and not session.shouldstop and not session.shouldfail:
        _write_partial(session.config, False)


def _machine() -> dict:
    """What pytest-benchmark's own machine_info holds that the rendered page names (system, release, Python)."""
    return {"node": platform.node(), "machine": platform.machine(), "system": platform.system(),
            "release": platform.release(), "python_version": platform.python_version()}


def _meta(config) -> dict:
    """The run's context for the renderer and the gate: the command, device, versions, sizes, bands, warm-up."""
    from veloxquant.tools._env import command_line, versions
    from veloxquant.tools.bench.harness import device_info
    b = config._veloxquant_bench
    if getattr(b, "_meta", None) is None:
        info = device_info()
        info["type"] = b.device
        b._meta = {"command": command_line("pytest", quote=True),
                   "device": info, "versions": versions(), "sizes": b.sizes, "bands": harness.BANDS,
                   "warmup": harness.WARMUP_NOTE,
                   **({"contexts": b.contexts} if b.contexts else {}), "batches": b.batches,
                   **({"kv_arms": b.kv_arms} if b.kv_arms else {}),
                   **({"named_arms": b.named_arms} if b.named_arms else {}),
                   **({"slow_update_s": b.slow_update} if b.slow_update else {})}
    b._meta["host_probe"] = b.host
    return b._meta


def _told_commit() -> dict | None:
    """pytest-benchmark's commit_info where VELOXQUANT_GIT names the tree (tools/_env.py: a copy of the tree whose
    .git is stale, as on the GPU machine, would otherwise record that .git's commit)."""
    told = os.environ.get("VELOXQUANT_GIT")
    return {"id": told, "dirty": False, "source": "VELOXQUANT_GIT"} if told else None


def pytest_benchmark_update_json(config, benchmarks, output_json):
    output_json["veloxquant"] = _meta(config)
    if _told_commit():
        output_json["commit_info"] = _told_commit()
