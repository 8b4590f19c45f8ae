"""The benchmarks' shared pieces: sizes per device, paired timing (ours timed by pytest-benchmark, the baseline
timed in the same rounds), the ratio gate and the test-only slowed update.

Paired timing: every round of `benchmark.pedantic` times our arm (pytest-benchmark's own statistics) and, right
before it on even rounds and right after it on odd ones (setup / teardown, untimed by pytest-benchmark), the
baseline arm on the same input. The gated number is the median of the per-round ratios ours / baseline: a slow
moment of the shared host hits both arms of a round, so the ratio moves far less from run to run than either
time does.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import time

from veloxquant.tools.bench import arms as bench_arms
from veloxquant.tools.bench import kv_arms

ROOT = pathlib.Path(__file__).resolve().parent.parent
POOL = 10                    # distinct inputs per benchmark, rotating (project policy: >= 10)

# Sizes per device. cpu: the quick gate (a 2-core CI machine, seconds per benchmark); gpu: past launch overhead
# (Llama-3-8B-shaped attention at 32k tokens: 128 MiB of fp16 K+V per layer). decode_step and generate run at each
# context of --bench-contexts (default: the `context` here); batch_generate at each (context, sequences) of `configs`.
# Warm-up: each benchmark's first `warmup` rounds run both arms untimed (kernel compilation, allocator growth).
SIZES = {
    "cpu": {
        "decode_step": dict(context=1024, layers=2, rounds=20, warmup=2),
        "generate": dict(context=512, layers=2, tokens=4, rounds=6, warmup=1, shape="cpu"),
        "batch_generate": dict(configs=[(256, 2)], layers=2, tokens=4, rounds=3, warmup=1, shape="cpu"),
        "cold_start": dict(context=128, layers=2, tokens=4, rounds=3, warmup=0, shape="cpu", arms=["turboquant b4"]),
        "ops": dict(tokens=1024, rounds=20, warmup=2, reference_every=5),
        "kernels": dict(vectors=[8192], rounds=10, warmup=2),       # skips: the kernels need a GPU
    },
    "gpu": {
        "decode_step": dict(context=32768, layers=8, rounds=60, warmup=5),
        # generate rounds cost ~0.1 s each: enough of them that one slow round does not move the gated median
        "generate": dict(context=32768, layers=4, tokens=64, rounds=7, warmup=1, shape="llama3-8b"),
        "batch_generate": dict(configs=[(8192, 8), (32768, 4)], layers=4, tokens=32, rounds=5, warmup=1,
                               shape="llama3-8b"),
        "cold_start": dict(context=4096, layers=2, tokens=8, rounds=2, warmup=0, shape="llama3-8b",
                           arms=["turboquant b4"]),
        "ops": dict(tokens=32768, rounds=20, warmup=3, reference_every=20),
        "kernels": dict(vectors=[262144, 1048576], rounds=30, warmup=3),   # past launch overhead
    },
}
WARMUP_NOTE = ("warm-up: each benchmark first runs `warmup` untimed rounds of its arm and of its baseline arms, in the "
               "same process, on the same prefilled caches (kernel compilation and allocator growth happen there)")
# Our arms, from the one table (tools/bench/arms.py OURS): a CPU run measures the quick ones (so
# the quick gate stays quick); --device gpu also every method and window (issue 29's table) and mlx-lm's
# QuantizedKVCache (q4, q8), each timed against fp16 in the same rounds.
ARMS = {n: bench_arms.OURS[n] for n in bench_arms.QUICK}
GPU_ARMS = {n: s for n, s in bench_arms.OURS.items() if n not in ARMS}
ALL_ARMS = {**ARMS, **GPU_ARMS}
MLX_Q = tuple(n for n in bench_arms.BASELINES if n.startswith("mlx q"))     # mlx-lm's quantized caches
# which arms each suite measures on the GPU (the CPU measures ARMS). batch_generate: every method once at its arm's
# window, turboquant also with window 32 (a windowed B-row batch), the mixed arm (mlx-lm's QuantizedKVCache has no
# merge, so the q4 / q8 caches are not in the batch table)
GPU_SUITE_ARMS = {"decode_step": [*ALL_ARMS, *MLX_Q], "generate": [*ALL_ARMS, *MLX_Q],
                  "batch_generate": [n for n in ALL_ARMS if n == "turboquant b4 (window 32)" or (
                      "(window 32)" not in n and not n.startswith("kivi b2"))]}


# the suites that take --bench-kv's arms (explicit key/value configurations, tools/bench/kv_arms.py)
KV_SUITES = ("decode_step", "generate", "batch_generate")


def suite_arms(default: list[str], kv: dict, only: bool, named: list[str] | tuple = ()) -> list[str]:
    """The `arm` parameters of a KV_SUITES benchmark: its default arms (or --bench-arms' `named` in their stead), then
    --bench-kv's (names of kv_arms.kv_arm; with --bench-kv-only those alone)."""
    first = [] if only else list(named or default)
    return first + [n for n in kv if only or n not in first]


def cache_settings(arm: str) -> dict:
    """{"cache": make_prompt_cache's settings} of one of our arms for its extra_info (what the quality recommendation
    matches a measured arm by, tools/quality/speed.py); {} for mlx-lm's caches and for an arm with tuning knobs (an
    A/B, not the configuration as shipped)."""
    if arm in MLX_Q or bench_arms.split(arm)[1]:
        return {}
    return {"cache": bench_arms.settings(arm)}


def skip_unless_measured(device: str, suite: str, arm: str, asked=()) -> None:
    """pytest.skip for an arm this device does not measure in `suite` (`asked`: --bench-arms' arms, measured on any
    device)."""
    import pytest
    if arm in ARMS or (device == "gpu" and arm in GPU_SUITE_ARMS.get(suite, ())):
        return
    if suite in KV_SUITES and (arm in asked or kv_arms.kv_arm_settings(arm) is not None):   # asked for by name
        return
    if arm in MLX_Q and suite == "batch_generate":
        pytest.skip(f"{arm}: mlx-lm's QuantizedKVCache has no merge, so its BatchGenerator cannot batch it")
    if device == "gpu":
        pytest.skip(f"{arm}: not measured in {suite}")
    pytest.skip(f"{arm}: measured with --device gpu only")


_Q_PROBED: dict = {}


def skip_unless_mlx_q_works(arm: str) -> None:
    """pytest.skip for mlx-lm's QuantizedKVCache where this MLX build cannot attend over it (MLX 0.32.4's CUDA
    backend has no quantized_matmul for the attention's transposed shapes): one small step through mlx-lm's
    dispatch, tried once per arm and session, before the arm's prefill is paid for."""
    import pytest
    if arm not in MLX_Q:
        return
    if arm not in _Q_PROBED:
        import mlx.core as mx
        from veloxquant.tools.bench.harness import D, HKV, HQ
        try:
            caches = bench_arms.make(arm, 1)
            kv = mx.random.normal((1, HKV, 64, D)).astype(mx.float16)
            caches[0].update_and_fetch(kv, kv)
            mx.eval(bench_arms.step(caches, mx.zeros((1, HQ, 1, D), mx.float16), kv[:, :, :1], kv[:, :, :1]))
            _Q_PROBED[arm] = None
        except Exception as e:         # the backend's own message says what is missing
            _Q_PROBED[arm] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    if _Q_PROBED[arm]:
        pytest.skip(f"{arm}: does not run on this device ({_Q_PROBED[arm]})")


# Noise band per suite (or per baseline arm): a run fails when a ratio exceeds the saved baseline's by more than this
# fraction. Chosen from five runs with our code unchanged on the shared 2-core CPU (load average 100-280), the largest
# rise of a gated ratio over another run's: 25 % (decode step, turboquant), 36 % (ops against mx.quantize, turboquant
# decode), 41 % (generate), 58 % (cold start); a band sits above that. The ratio to the numpy reference is measured
# every few rounds only, beside numpy's own use of the cores, and moved by up to 170 %: reported, not gated (None).
# On that host the decode step's kivi ratio also fell from 0.62 to 0.17 in one run (fp16's step twice as slow under
# the load): a drop never fails, but a baseline saved in such a moment would make later runs fail; save baselines
# on a quiet machine and look at the ratios' IQR (the renderer shows it).
# kernels (GPU only): no run yet to choose its band from; the ops band until an H200 baseline has kernels benchmarks.
BANDS = {"decode_step": 0.35, "generate": 0.60, "batch_generate": 0.60, "cold_start": 0.75,
         "ops": {"mx.quantize": 0.50, "reference": None}, "kernels": 0.50}

SLOW_UPDATE_ENV = "VELOXQUANT_BENCH_SLOW_UPDATE"


def slow_update_mutant() -> float:
    """A deliberately slowed decode step, for showing the gate fails: with VELOXQUANT_BENCH_SLOW_UPDATE=<seconds>
    every update_and_fetch of ours (VeloxKVCache and the batch caches) first spins that long on the host (busy, so it
    counts under a wall-clock or a process-time timer alike). Applied here, in the benchmark process (and the
    cold-start child), never in the library. Returns the seconds (0.0: not applied)."""
    raw = os.environ.get(SLOW_UPDATE_ENV, "")
    if not raw:
        return 0.0
    try:
        delay = float(raw)
    except ValueError:
        raise ValueError(f"{SLOW_UPDATE_ENV}: expected seconds (a number), got {raw!r}") from None
    from veloxquant.accelerated.cache import VeloxKVCache
    from veloxquant.accelerated.cache.batch import BatchVeloxKVCache
    from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
    for cls in (VeloxKVCache, BatchVeloxKVCache, SharedBatchVeloxKVCache):    # the batch caches: batch_generate
        real = cls.__dict__["update_and_fetch"]
        if getattr(real, "_slowed", None) is not None:
            continue

        def slowed(self, keys, values, _real=real):
            end = time.perf_counter() + delay
            while time.perf_counter() < end:
                pass
            return _real(self, keys, values)
        slowed._slowed = delay
        cls.update_and_fetch = slowed
    return delay


def paired(benchmark, ours, baselines: dict, *, rounds: int, warmup: int, prepare=None, every: dict | None = None,
           info: dict | None = None) -> dict:
    """Times `ours(i, *prepare(i))` with benchmark.pedantic and each baseline arm in the same rounds, with the same
    timer (pytest-benchmark's, --benchmark-timer), rounds alternating baseline-first and baseline-last; i is the
    round's input index. A baseline is `run(i)` or `(prep, run)` with `run(i, *prep(i))` timed and prep untimed (a
    freshly prefilled cache, say), as `prepare` is for ours. `every[name] = k` times that baseline on every k-th round
    only (an expensive one such as the numpy reference). Records in benchmark.extra_info and returns
    {"ratios": {name: median over rounds of ours / name}, ...}."""
    import mlx.core as mx
    every = every or {}
    timer = getattr(benchmark, "_timer", time.perf_counter)
    state = {"round": 0}
    base_t = {n: {} for n in baselines}     # timed round index (after warm-up) -> seconds
    probes = {}                             # timed round index -> round_probe's µs, taken before the round's arms

    def time_baselines(r):
        j = r - warmup
        for name, arm in baselines.items():
            k = every.get(name, 1)
            if (j < 0 and k > 1) or (j >= 0 and j % k):     # an expensive baseline skips the warm-up rounds
                continue
            prep, run = arm if isinstance(arm, tuple) else (None, arm)
            args = tuple(prep(r % POOL)) if prep else ()
            mx.synchronize()
            t0 = timer()
            run(r % POOL, *args)
            t = timer() - t0
            del args
            if j >= 0:
                base_t[name][j] = t

    def setup():
        r = state["round"]
        p = round_probe()
        if r >= warmup:
            probes[r - warmup] = p
        if r % 2 == 0:
            time_baselines(r)
        extra = tuple(prepare(r % POOL)) if prepare else ()
        mx.synchronize()
        return (r % POOL, *extra), {}

    def teardown(*_a, **_k):
        r = state["round"]
        if r % 2 == 1:
            time_baselines(r)
        state["round"] = r + 1

    benchmark.pedantic(ours, setup=setup, teardown=teardown, rounds=rounds, warmup_rounds=warmup)
    out = {"ratios": {}, "ratio_iqr": {}, "baseline_median_s": {}, "rounds": rounds, "warmup": warmup}
    stats = getattr(benchmark, "stats", None)
    data = list(stats.stats.data) if stats is not None else []
    if data:
        out["median_s"] = statistics.median(data)
        # per baseline, ours ÷ it in each timed round: {round index: ratio}
        ratios = {name: {j: data[j] / t for j, t in ts.items() if j < len(data) and t > 0}
                  for name, ts in base_t.items()}
        for name, ts in base_t.items():
            per_round = sorted(ratios[name].values())
            if not per_round:
                continue
            out["ratios"][name] = statistics.median(per_round)
            out["ratio_iqr"][name] = per_round[3 * len(per_round) // 4] - per_round[len(per_round) // 4]
            out["baseline_median_s"][name] = statistics.median(ts.values())
        out.update(_host_rounds(ratios, probes))
    out.update(info or {})
    benchmark.extra_info.update(out)
    return out


_FASTEST = [float("inf")]    # the fastest host probe of this process, µs per sum(range(1000)): its host at full speed
SLOW_HOST = 1.5              # a round whose probe is this much above _FASTEST ran on a slowed host (the slowed GPU
                             # hosts ran at half speed: 2x; the margin is for the scatter of a short probe)


def round_probe(reps: int = 10, bursts: int = 3) -> float:
    """µs per `sum(range(1000))` now (host_probe's Python half, short enough to take before every round). Some GPU
    machines' hosts ran at half speed for minutes in the middle of a run (docs/decode-step-analysis.md), which moves
    host-paced ratios; a run's start and end probes do not see it."""
    us = []
    for _ in range(bursts):     # (the fastest burst: one interruption by a neighbour does not flag a round)
        t0 = time.perf_counter()
        for _ in range(reps):
            sum(range(1000))
        us.append((time.perf_counter() - t0) / reps * 1e6)
    _FASTEST[0] = min(_FASTEST[0], min(us))
    return min(us)


def _host_rounds(ratios: dict, probes: dict) -> dict:
    """paired()'s record of the host per timed round: each round's probe (µs), how many ran on a slowed host (probe
    > SLOW_HOST x the process's fastest), and each baseline's median ratio (`ratios`: paired's per round) over the
    other rounds (where 3 or more)."""
    slow = {j for j, p in probes.items() if p > SLOW_HOST * _FASTEST[0]}
    steady = {}
    for name, per_round in ratios.items():
        per = [r for j, r in per_round.items() if j not in slow]
        if len(per) >= 3:
            steady[name] = statistics.median(per)
    return {"host_round_us": [round(probes[j], 2) for j in sorted(probes)], "slow_host_rounds": len(slow),
            "slow_host_factor": SLOW_HOST, "ratios_steady": steady}


# ---- the gate ----------------------------------------------------------------------------------------------
def gate_key(info: dict) -> str:
    """The gate's name of a benchmark, from what it measured (its extra_info: suite, arm, op, context, batch), not
    from its pytest id: a run with other --bench-contexts or another order is compared benchmark by benchmark."""
    parts = [info.get("arm", "?")] + [f"{k} {info[k]}" for k in ("op", "context", "batch", "vectors") if k in info]
    return f"{info.get('suite', '?')}[{', '.join(map(str, parts))}]"


def load_ratios(path: pathlib.Path) -> dict[str, dict[str, float]]:
    """{gate_key: {baseline name: ratio}} of a pytest-benchmark JSON written by these benchmarks."""
    data = json.loads(pathlib.Path(path).read_text())
    return {gate_key(b.get("extra_info", {})): dict(b.get("extra_info", {}).get("ratios", {}))
            for b in data.get("benchmarks", [])}


def band_of(suite: str, name: str, bands: dict | None = None) -> float | None:
    """The noise band of ratio ours / `name` in `suite` (None: reported, not gated)."""
    b = (BANDS if bands is None else bands)[suite]
    return b.get(name) if isinstance(b, dict) else b


def check(fullname: str, suite: str, ratios: dict[str, float], baseline: dict[str, dict[str, float]],
          band: float | None = None) -> list[str]:
    """Regressions of `ratios` against the baseline's ratios for the same benchmark (`fullname`: its gate_key): a
    message for each ratio above the baseline's by more than its band (band_of, unless `band` is given for all). A
    benchmark or ratio the baseline lacks is not a regression (a new benchmark gets its baseline at the next save)."""
    old = baseline.get(fullname, {})
    bad = []
    for name, r in ratios.items():
        b = old.get(name)
        limit = band if band is not None else band_of(suite, name)
        if b is not None and limit is not None and r > b * (1 + limit):
            bad.append(f"{fullname}: ours / {name} = {r:.3f}, baseline {b:.3f}: +{r / b - 1:.0%}, beyond the "
                       f"{limit:.0%} noise band")
    return bad


# ---- models and prefilled caches shared by the benchmarks of one context ----------------------------------------
_MODELS: dict = {}
_SHARED: dict = {}


def model(layers: int, shape: str):
    """The random llama of `layers` layers and shape `shape` (tools/bench/arms.py SHAPES), made once per session."""
    key = (layers, shape)
    if key not in _MODELS:
        _MODELS.clear()
        _MODELS[key] = bench_arms.model(layers, bench_arms.SHAPES[shape])
    return _MODELS[key]


def shared(suite: str, key, make):
    """`make()`, kept for the next benchmark of `suite` with the same key (one key per suite: the benchmarks run
    context by context, so the previous context's caches are freed)."""
    old = _SHARED.get(suite)
    if old is None or old[0] != key:
        _SHARED.pop(suite, None)
        import mlx.core as mx
        mx.clear_cache()
        _SHARED[suite] = (key, make())
    return _SHARED[suite][1]


def prefill_model(net, tokens, cache, chunk: int = 2048) -> list:
    """`cache` (one per layer) filled by running `net` on `tokens` (1-D) in chunks, as generate_step prefills."""
    import mlx.core as mx
    for s in range(0, tokens.shape[0], chunk):
        net(tokens[None, s:s + chunk], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def fill_from(caches: list, source: list, chunk: int = 4096) -> list:
    """Each of `caches` (ours or mlx-lm's) given the keys and values a model wrote into `source` (mlx-lm KVCaches of
    the same layers, their first `offset` tokens), in chunks: the prompt's prefill without running the model again."""
    import mlx.core as mx
    for c, s in zip(caches, source):
        for a in range(0, s.offset, chunk):
            b = min(a + chunk, s.offset)
            c.update_and_fetch(s.keys[..., a:b, :], s.values[..., a:b, :])
        mx.eval([c.state for c in caches])
    for c in caches:
        if hasattr(c, "check"):
            c.check()
    return caches


def make_caches(arm: str, net, layers: int) -> list:
    """Empty caches of arm `arm` for `net`: mlx-lm's QuantizedKVCache (MLX_Q) or ours (make_prompt_cache; an arm's
    tuning knobs are applied where it is filled and stepped, bench_arms.knobs)."""
    if arm in MLX_Q:
        return bench_arms.make(arm, layers)
    import veloxquant.accelerated.cache as vc
    return vc.make_prompt_cache(net, seed=1, **bench_arms.settings(arm))


def host_probe(reps: int = 2000, rounds: int = 5) -> dict:
    """This host's speed at what paces our decode step at long context (docs/decode-step-analysis.md): µs per MLX op
    built (not evaluated: an add, a multiply and a slice of a small array, what a step's Python makes) and µs per
    `sum(range(1000))` of plain Python, medians of `rounds`. Recorded at a run's start and end, so that host-paced
    ratios from different machines can be read side by side."""
    import mlx.core as mx
    a = mx.zeros((8, 128))
    builds, loops = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            (a + 1.0) * 2.0
            a[:, :64]
        builds.append((time.perf_counter() - t0) / (3 * reps) * 1e6)
        t0 = time.perf_counter()
        for _ in range(reps):
            sum(range(1000))
        loops.append((time.perf_counter() - t0) / reps * 1e6)
    _FASTEST[0] = min(_FASTEST[0], min(loops))
    return {"mlx_op_build_us": round(statistics.median(builds), 3),
            "python_sum1000_us": round(statistics.median(loops), 3)}
