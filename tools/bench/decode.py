"""Decode-step benchmark (a benchmark, not a test): what one generated token costs per layer with each
cache, as mlx-lm runs it, side by side in one process.

`layer` suite: L layers (default 8) per evaluation, each a cache prefilled to the context length; one step
appends one token to every layer's cache (update_and_fetch) and attends with mlx-lm's
base.scaled_dot_product_attention (so packed caches go through the hooked dispatch, exactly as in a
model); each layer's output is the next layer's query, so the layers run in sequence as in a model. Arms:
mlx-lm's KVCache (fp16, mx.fast.scaled_dot_product_attention), mlx-lm's QuantizedKVCache (q4, q8) and ours.
Arms are interleaved step by step over a rotating pool of inputs; medians per arm. Also per arm: the bytes
the step must read per layer (the cache as stored), the fraction of the measured copy bandwidth that makes,
the resident cache bytes and the step's transient peak memory, and which attention path ran.

`e2e` suite: mlx_lm.generate.generate_step with a random model shaped like Llama-3-8B (few layers),
prompt of the context length, tokens/s of the generated tokens, fp16 cache vs ours.

`batch` suite: mlx_lm.batch_generate (the BatchGenerator behind mlx_lm.server's batching) with the same model,
B prompts of about the context length (different lengths, so the batch pads), generation tokens/s of the whole
batch: mlx-lm's BatchKVCache vs ours (our caches handed in as prompt_caches, merged by mlx-lm into
BatchVeloxKVCache, which attends per sequence over each one's own record).

    python3 -m veloxquant.tools.cli bench-decode --device gpu --contexts 4096 32768 131072 --json out.json
    python3 -m veloxquant.tools.cli bench-decode --from-json docs/bench/*-decode*.json --markdown docs/benchmarks-decode.md
"""
from __future__ import annotations

import contextlib
import json
import pathlib
import shlex
import statistics
import sys
import time

from . import arms as bench_arms
from . import gpu_clock
from .harness import D, HKV, HQ, PIPE
from .decode_report import _e2e_medians, _plots, _round_medians, plot, plot_batch, render  # noqa: F401,E501
from .._env import utc_now_iso, versions

POOL = 10


def add_arguments(p) -> None:
    p.add_argument("--device", choices=["cpu", "gpu"], default=None)
    p.add_argument("--suites", nargs="+", choices=["layer", "e2e", "batch"], default=["layer"])
    p.add_argument("--contexts", nargs="+", type=int, default=[4096, 32768, 131072])
    p.add_argument("--layers", type=int, default=8, help="layers per evaluation (layer suite)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per arm (layer suite)")
    p.add_argument("--pipe", type=int, default=PIPE, help="steps per pipelined sample (layer suite; >= 3 for the "
                   "steady state)")
    p.add_argument("--layer-batch", type=int, default=1,
                   help="sequences per step (layer suite): B of t, t - 17, ... tokens merged into a batch cache")
    p.add_argument("--arms", nargs="+", default=None, help="subset of arm names (default: all)")
    p.add_argument("--e2e-contexts", nargs="+", type=int, default=[8192, 32768, 131072])
    p.add_argument("--e2e-layers", type=int, default=4)
    p.add_argument("--e2e-tokens", type=int, default=48)
    p.add_argument("--e2e-rounds", type=int, default=1, help="runs per arm and context, arms in turn; medians")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[4, 8])
    p.add_argument("--batch-contexts", nargs="+", type=int, default=[4096, 32768])
    p.add_argument("--model-shape", type=json.loads, default=None, metavar="JSON",
                   help="the batch suite's llama config instead of Llama-3-8B's: every field of "
                        "tools/bench/arms.py LLAMA3_8B (hidden_size, intermediate_size, num_attention_heads, "
                        "num_key_value_heads, head_dim, vocab_size)")
    p.add_argument("--json", type=pathlib.Path, default=None)
    p.add_argument("--from-json", type=pathlib.Path, nargs="+", default=None, metavar="JSON")
    p.add_argument("--markdown", type=pathlib.Path, default=None)
    p.add_argument("--plot", type=pathlib.Path, default=None, metavar="PNG",
                   help="the layer suite's plot here, the batch suite's at PNG's name + '-batch' (with --from-json: "
                        "the first file's)")


def _make_batch(name: str, layers: int, t: int, batch: int, log) -> list:
    """Per layer, a batch of `batch` sequences of t, t - 17, t - 34, ... tokens (so the batch pads), each prefilled
    on its own and merged as mlx-lm's BatchGenerator merges prompt caches (fp16: BatchKVCache; ours: VeloxKVCache
    .merge, one B-row cache where the method allows)."""
    seqs = []
    for j in range(batch):
        one = bench_arms.make(name, layers)
        bench_arms.prefill(one, max(1, t - 17 * j), log, seed=1000 * j)
        seqs.append(one)
    return [layer[0].merge(list(layer)) for layer in zip(*seqs)]


def _pipelined(caches, q, k, v, more) -> list[float]:
    """1 + len(more) steps as generate_step runs them: step n + 1 built while step n is evaluated, its query
    step n's output (the next token depends on the last), its key and value from `more`. Returns the host's clock
    when each step was seen done: after the first, their spacing is the steady state of a long generation (no
    first build alone, no last evaluation alone)."""
    import mlx.core as mx
    done = []
    y = bench_arms.step(caches, q, k, v)
    mx.async_eval(y)
    for kv in more:
        y2 = bench_arms.step(caches, y, *kv)
        mx.async_eval(y2)
        mx.eval(y)
        done.append(time.perf_counter())
        y = y2
    mx.eval(y)
    done.append(time.perf_counter())
    return done


def copy_bandwidth(log) -> float:
    """Bytes/s of a float16 copy (read + write; 1 GiB on a GPU, 128 MiB on the CPU), median of 10: the
    ceiling the steps are read against."""
    import mlx.core as mx
    n = 1 << (29 if mx.default_device().type == mx.DeviceType.gpu else 26)
    x = mx.random.normal((n,)).astype(mx.float16)
    mx.eval(x)
    ts = []
    for _ in range(12):
        t0 = time.perf_counter()
        y = x * 1
        mx.eval(y)
        ts.append(time.perf_counter() - t0)
        del y
    bw = 2 * x.nbytes / statistics.median(ts[2:])
    log(f"copy ceiling: {bw / 1e9:.1f} GB/s ({x.nbytes >> 20} MiB float16, read + write)")
    return bw


def layer_suite(contexts, layers: int, steps: int, arms: list[str], log, pipe: int = PIPE, batch: int = 1) -> list[dict]:
    """Per-layer decode step of every arm at each context, arms interleaved; with `batch` > 1 a batch of sequences
    of different lengths (merged as mlx-lm's BatchGenerator merges them) attended with its left-padding mask."""
    import mlx.core as mx

    rows = []
    for t in contexts:
        log(f"context {t}: prefilling {len(arms)} arms x {layers} layers")
        state = _prefill_arms(arms, layers, t, batch, log, rows)
        pool = [(mx.random.normal((batch, HQ, 1, D), key=mx.random.key(100 + i)).astype(mx.float16),
                 mx.random.normal((batch, HKV, 1, D), key=mx.random.key(200 + i)).astype(mx.float16),
                 mx.random.normal((batch, HKV, 1, D), key=mx.random.key(300 + i)).astype(mx.float16))
                for i in range(POOL)]
        mx.eval(pool)
        samples, paths, errors, gpu_base, gpu_why = _time_steps(state, pool, steps, pipe, log)
        for name in state:
            if name in errors:
                rows.append({"context": t, "arm": name, "error": errors[name]})
                continue
            rows.append(_layer_row(t, name, state[name], samples[name], paths[name], pool, layers, batch, pipe,
                                   gpu_base, gpu_why))
        _vs_fp16(rows, t, log)
        del state
        mx.clear_cache()
    return rows


def _prefill_arms(arms, layers: int, t: int, batch: int, log, rows: list) -> dict:
    """arm -> its caches prefilled to `t` tokens; an arm that fails gets an error row in `rows` instead."""
    state = {}
    for name in arms:
        t0 = time.perf_counter()
        try:
            if batch > 1:
                with bench_arms.knobs(name):          # (SHARED decides at merge which batch cache it is)
                    caches = _make_batch(name, layers, t, batch, log)
            else:
                caches = bench_arms.make(name, layers)
                bench_arms.prefill(caches, t, log)
            state[name] = caches
            log(f"  {name}: {bench_arms.nbytes(caches) / layers / 1e6:.1f} MB per layer, "
                f"{time.perf_counter() - t0:.1f} s")
        except Exception as e:            # e.g. a backend without a kernel for this shape
            rows.append({"context": t, "arm": name, "error": f"{type(e).__name__}: {e}"})
            log(f"  {name}: prefill failed: {type(e).__name__}: {e}")
    return state


@contextlib.contextmanager
def _count_paths(seen: dict):
    """Count, into `seen`, the attention paths the step takes (attention.path) and the decode step's launches."""
    from ...accelerated import attention as attention
    from ...accelerated.kernels import decode_step
    real_path = attention.path
    real_step = decode_step.DecodeStep.attend

    def spy(*a, **kw):
        p = real_path(*a, **kw)
        seen[p] = seen.get(p, 0) + 1
        return p

    def spy_step(self, *a, **kw):     # the decode step's launch (no path() call)
        out = real_step(self, *a, **kw)
        if out is not None:
            seen["kernels"] = seen.get("kernels", 0) + 1
        return out
    attention.path = spy
    decode_step.DecodeStep.attend = spy_step
    try:
        yield
    finally:
        attention.path = real_path
        decode_step.DecodeStep.attend = real_step


def _time_steps(state: dict, pool: list, steps: int, pipe: int, log):
    """Time every arm's step, arms interleaved (3 warm-up rounds): per arm its samples (lists of `time`,
    `build`, `piped`, `steady`, `gpu` seconds), the attention paths counted, and the arms whose step failed."""
    samples = {n: {"time": [], "build": [], "piped": [], "steady": [], "gpu": []} for n in state}
    paths = {n: {} for n in state}
    errors = {}
    gpu_ok, gpu_why = gpu_clock.available()
    gpu_base = gpu_clock.overhead_s(list(pool[0])) if gpu_ok else 0.0
    for it in range(steps + 3):
        order = list(state)
        order = order[it % len(order):] + order[: it % len(order)]
        for name in order:
            if name in errors:
                continue
            q, k, v = pool[(it + len(samples[name]["time"])) % POOL]
            try:
                with _count_paths(paths[name]), bench_arms.knobs(name):
                    got = _time_one(state[name], q, k, v, pool, it, pipe, gpu_base if gpu_ok else None)
            except Exception as e:
                errors[name] = f"{type(e).__name__}: {e}"
                log(f"  {name}: step failed: {errors[name]}")
                continue
            if it >= 3:
                for key, x in zip(("time", "build", "piped", "steady", "gpu"), got):
                    if x is not None:
                        samples[name][key].append(x)
    return samples, paths, errors, gpu_base, gpu_why


def _time_one(caches, q, k, v, pool, it: int, pipe: int, gpu_base):
    """One step of one arm: (step, host build, pipelined per step, pipelined steady, GPU) seconds; the last two
    None where they cannot be measured (fewer than 3 pipelined steps; no GPU clock, gpu_base None)."""
    import mlx.core as mx
    t0 = time.perf_counter()
    y = bench_arms.step(caches, q, k, v)
    tb = time.perf_counter() - t0          # the host's build of the graph (Python, MLX calls)
    mx.eval(y)
    dt = time.perf_counter() - t0
    # as generate_step runs it: step n + 1 built while step n is evaluated (its query is
    # step n's output, as the next token depends on the last), PIPE steps per sample
    mx.synchronize()
    more = [pool[(it + j) % POOL][1:] for j in range(1, pipe)]
    t0 = time.perf_counter()
    done = _pipelined(caches, q, k, v, more)
    dtp = (done[-1] - t0) / pipe
    dts = statistics.median(b - a for a, b in zip(done, done[1:])) if pipe >= 3 else None
    # the GPU's own time for the step: its launches all queued behind a hold (gpu_clock)
    dtg = None
    if gpu_base is not None:
        th = gpu_clock.hold()
        y = bench_arms.step(caches, *gpu_clock.gate([q, k, v], th))
        te = gpu_clock.stamp(y)
        mx.eval(th, te, y)
        dtg = gpu_clock.span_s(th, te) - gpu_base
    return dt, tb, dtp, dts, dtg


def _step_memory(name: str, caches, pool, pipe: int) -> tuple[int, int]:
    """Transient peak bytes of one more step, and of `pipe` steps pipelined as generate_step runs them."""
    import mlx.core as mx
    q, k, v = pool[0]
    mx.synchronize()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    with bench_arms.knobs(name):
        mx.eval(bench_arms.step(caches, q, k, v))
    transient = mx.get_peak_memory() - before
    # ... pipelined: a cache whose update cannot reuse a buffer the step in flight still holds copies it here
    # (mlx-lm's KVCache: slice_update without donation)
    mx.synchronize()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    with bench_arms.knobs(name):
        _pipelined(caches, q, k, v, [pool[j % POOL][1:] for j in range(1, pipe)])
    return int(transient), int(mx.get_peak_memory() - before)


def _layer_row(t, name, caches, s: dict, paths: dict, pool, layers: int, batch: int, pipe: int, gpu_base,
               gpu_why) -> dict:
    """One arm's row at one context: medians per layer, spread, bytes, memory (resident + the step's peak)."""
    transient, transient_piped = _step_memory(name, caches, pool, pipe)
    ts = sorted(s["time"])
    med = statistics.median(ts)
    return {"context": t, "arm": name, "layers": layers, "steps": len(ts), "batch": batch,
            "step_s": med, "layer_s": med / layers,
            "pipelined_layer_s": statistics.median(s["piped"]) / layers, "pipe": pipe,
            **({"pipelined_steady_layer_s": statistics.median(s["steady"]) / layers} if s["steady"] else {}),
            "build_layer_s": statistics.median(s["build"]) / layers,
            "kv_gated": True,
            **({"gpu_layer_s": statistics.median(s["gpu"]) / layers, "gpu_overhead_s": gpu_base}
               if s["gpu"] else
               {"gpu_clock": gpu_why}),
            "layer_s_iqr": (ts[3 * len(ts) // 4] - ts[len(ts) // 4]) / layers,
            "bytes_per_layer": bench_arms.nbytes(caches) / layers,
            "transient_peak_bytes": transient,
            "pipelined_transient_peak_bytes": transient_piped, "paths": paths}


def _vs_fp16(rows: list[dict], t: int, log) -> None:
    """Each row at context `t` against the fp16 KVCache row of the same context (ratios added to the rows)."""
    base = next((r for r in rows if r["context"] == t and r["arm"] == "fp16 KVCache" and "layer_s" in r), None)
    for r in rows:
        if r["context"] == t and "layer_s" in r and base:
            r["vs_fp16"] = r["layer_s"] / base["layer_s"]
            r["pipelined_vs_fp16"] = r["pipelined_layer_s"] / base["pipelined_layer_s"]
            if "gpu_layer_s" in r and "gpu_layer_s" in base:
                r["gpu_vs_fp16"] = r["gpu_layer_s"] / base["gpu_layer_s"]
            if "pipelined_steady_layer_s" in r and "pipelined_steady_layer_s" in base:
                r["pipelined_steady_vs_fp16"] = r["pipelined_steady_layer_s"] / base["pipelined_steady_layer_s"]
            log(f"  {r['arm']:<26} {r['layer_s'] * 1e6:8.1f} us/layer  x{r['vs_fp16']:.2f} of fp16  "
                f"pipelined {r['pipelined_layer_s'] * 1e6:8.1f} us/layer x{r['pipelined_vs_fp16']:.2f}  "
                f"steady {r.get('pipelined_steady_layer_s', float('nan')) * 1e6:8.1f} "
                f"x{r.get('pipelined_steady_vs_fp16', float('nan')):.2f}  "
                f"gpu {r.get('gpu_layer_s', float('nan')) * 1e6:7.1f} x{r.get('gpu_vs_fp16', float('nan')):.2f}  "
                f"{r['bytes_per_layer'] / 1e6:7.1f} MB/layer  paths {r['paths']}")


def e2e_suite(contexts, n_layers: int, n_tokens: int, arms: list[str], log, rounds: int = 1) -> list[dict]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from ...accelerated import cache as vc
    model, args = bench_arms.model(n_layers)
    rows = []

    def caches_for(name):
        if name == "fp16 KVCache":
            return None
        return vc.make_prompt_cache(model, seed=1, **bench_arms.settings(name))

    # warm-up: the first step of each arm compiles its kernels (NVRTC, seconds); not part of any timing. The prompt
    # spans a whole prefill chunk (generate_step's 2048 tokens) and a partial one: chunks of 2048 tokens take the
    # encode kernels' compiled-in variants (launches of 4096 rows and more), which a short prompt never compiles
    # (the thirteenth pass's 8k first token took 11.7 s, its 32k one 0.43 s)
    warm = mx.random.randint(0, args.vocab_size, (2048 + 300,), key=mx.random.key(1))
    for name in arms:
        if not name.startswith("mlx q"):
            try:
                with bench_arms.knobs(name):
                    for _ in generate_step(warm, model, max_tokens=4, prompt_cache=caches_for(name)):
                        pass
            except Exception as e:            # reported by the timed run below
                log(f"  e2e warm-up {name}: {type(e).__name__}: {e}")
    for t in contexts:
        prompt = mx.random.randint(0, args.vocab_size, (t,), key=mx.random.key(t))
        # rounds: every arm once per round, in turn (a slow moment of the host then hits all arms alike)
        for name in [n for _ in range(rounds) for n in arms]:
            if name.startswith("mlx q"):
                continue
            caches = caches_for(name)
            t0 = time.perf_counter()
            stamps = []
            try:
                with bench_arms.knobs(name):
                    for _tok, _lp in generate_step(prompt, model, max_tokens=n_tokens, prompt_cache=caches):
                        stamps.append(time.perf_counter())
            except Exception as e:
                rows.append({"context": t, "arm": name, "error": f"{type(e).__name__}: {e}"})
                log(f"  e2e {t} {name}: failed: {type(e).__name__}: {e}")
                continue
            gen = (len(stamps) - 1) / (stamps[-1] - stamps[0])
            rows.append({"context": t, "arm": name, "layers": n_layers, "tokens": len(stamps),
                         "prefill_s": stamps[0] - t0, "tokens_per_s": gen})
            log(f"  e2e context {t} {name:<24} prefill {stamps[0] - t0:6.2f} s, generation {gen:7.1f} tok/s")
            del caches
            mx.clear_cache()
    return _e2e_medians(rows)


def batch_suite(contexts, batch_sizes, n_layers: int, n_tokens: int, arms: list[str], log, rounds: int = 1,
                shape: dict | None = None) -> list[dict]:
    """mlx_lm.batch_generate with B prompts of lengths t, t - 17, t - 34, ... (so the batch pads): the batch's
    generation tokens/s (mlx-lm's BatchStats), prompt tokens/s and peak memory; fp16 BatchKVCache (mlx-lm's default)
    against ours handed in as prompt_caches. Arms in turn per round; medians of the rounds."""
    import mlx.core as mx

    from ...accelerated import cache as vc
    model, args = bench_arms.model(n_layers, shape)
    rows = []
    arms = [a for a in arms if not a.startswith("mlx q")]
    for t in contexts:
        for b in batch_sizes:
            prompts = [mx.random.randint(0, args.vocab_size, (max(1, t - 17 * i),), key=mx.random.key(t + i)).tolist()
                       for i in range(b)]
            for rnd, name in [(r, n) for r in range(rounds + 1) for n in arms]:   # round 0: warm-up (JIT), not kept
                given = None if name == "fp16 KVCache" else [
                    vc.make_prompt_cache(model, seed=1, **bench_arms.settings(name)) for _ in range(b)]
                mx.synchronize()
                mx.reset_peak_memory()
                try:
                    with bench_arms.knobs(name):
                        r, seen = bench_arms.batch_run(model, prompts, n_tokens, given)
                except Exception as e:
                    rows.append({"context": t, "batch": b, "arm": name, "round": rnd,
                                 "error": f"{type(e).__name__}: {e}"})
                    log(f"  batch {t} x{b} {name}: failed: {type(e).__name__}: {e}")
                    continue
                st = r.stats
                if rnd == 0:
                    continue
                rows.append({"context": t, "batch": b, "arm": name, "round": rnd, "layers": n_layers,
                             "tokens_per_sequence": n_tokens, "generation_tokens_per_s": st.generation_tps,
                             "prompt_tokens_per_s": st.prompt_tps, "peak_memory_bytes": int(st.peak_memory * 1e9),
                             "paths": seen})
                log(f"  batch context {t} x{b} {name:<24} generation {st.generation_tps:8.1f} tok/s, prompt "
                    f"{st.prompt_tps:8.1f} tok/s, peak {st.peak_memory:.2f} GB, paths {seen}")
                del given, r
                mx.clear_cache()
    for r in rows:
        r.pop("round", None)
    return _round_medians(rows, ("context", "batch"), "generation_tokens_per_s", ("prompt_tokens_per_s",),
                          ("peak_memory_bytes",))


def run(args) -> int:
    if args.from_json:
        if not args.markdown:
            print("bench-decode: --from-json needs --markdown", file=sys.stderr)
            return 2
        lines = ["# Decode-step benchmarks", "",
                 "Generated by `veloxquant bench-decode --from-json` (tools/bench/decode.py). Each section is one "
                 "run on one device.", ""]
        for p in args.from_json:
            lines += render(json.loads(p.read_text()), str(p))
        args.markdown.write_text("\n".join(lines) + "\n")
        print(f"wrote {args.markdown}")
        _plots(json.loads(args.from_json[0].read_text()), args.plot, print)
        return 0
    import mlx.core as mx

    from .harness import device_info, use_device
    if not use_device(args.device, "bench-decode"):
        return 2
    log = lambda *a: print(*a, flush=True)   # noqa: E731
    arms = bench_arms.arm_names(args.arms)
    res = {"command": " ".join(["veloxquant", "bench-decode", *map(shlex.quote, sys.argv[2:])]),
           "date": utc_now_iso(), "device": device_info(), "versions": versions(),
           "layer": [], "e2e": [], "batch": []}
    res["device"]["type"] = "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"
    res["copy_bytes_per_s"] = copy_bandwidth(log)
    t0 = time.perf_counter()
    if "layer" in args.suites:
        res["layer"] = layer_suite(args.contexts, args.layers, args.steps, arms, log, args.pipe, args.layer_batch)
    if "e2e" in args.suites:
        res["e2e"] = e2e_suite(args.e2e_contexts, args.e2e_layers, args.e2e_tokens, arms, log, args.e2e_rounds)
    if "batch" in args.suites:
        res["batch"] = batch_suite(args.batch_contexts, args.batch_sizes, args.e2e_layers, args.e2e_tokens, arms, log,
                                   args.e2e_rounds, args.model_shape)
        if args.model_shape:
            res["model_shape"] = args.model_shape
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1) + "\n")
        log(f"wrote {args.json}")
    if args.markdown:
        args.markdown.write_text("\n".join(render(res, str(args.json))) + "\n")
        log(f"wrote {args.markdown}")
    _plots(res, args.plot, log)
    return 0
