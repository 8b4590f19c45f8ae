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
import functools
import json
import pathlib
import shlex
import statistics
import sys
import time

from . import gpu_clock
from ._env import utc_now_iso, versions

B, HQ, HKV, D = 1, 32, 8, 128            # Llama-3-8B attention shape
POOL = 10
PIPE = 4            # steps per pipelined sample (layer suite)
OURS = {   # arm name -> make_prompt_cache-style settings (about 4 bits per coordinate where the method allows)
    "turboquant b4": dict(method="turboquant", bits=4),
    "turboquant_rvq 2+2": dict(method="turboquant_rvq", bits=2, bits2=2),
    "turboquant_prod b4": dict(method="turboquant_prod", bits=4),
    "kivi b4 (window 128)": dict(method="kivi", bits=4, group_size=32),
    "rabitq": dict(method="rabitq", bits=1),
    "mlx_affine b4": dict(method="mlx_affine", bits=4, group_size=64),
}


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
                        "bench_decode.LLAMA3_8B (hidden_size, intermediate_size, num_attention_heads, "
                        "num_key_value_heads, head_dim, vocab_size)")
    p.add_argument("--json", type=pathlib.Path, default=None)
    p.add_argument("--from-json", type=pathlib.Path, nargs="+", default=None, metavar="JSON")
    p.add_argument("--markdown", type=pathlib.Path, default=None)
    p.add_argument("--plot", type=pathlib.Path, default=None, metavar="PNG",
                   help="the layer suite's plot here, the batch suite's at PNG's name + '-batch' (with --from-json: "
                        "the first file's)")


# ---- arms ----------------------------------------------------------------------------------------------------
# An arm of ours may carry tuning knobs for an A/B in one run: "turboquant b4 [FUSE_COMBINE=0, DEVICE_COUNTS=0]"
# runs that arm's steps under accelerated.tuning.override(fuse_combine=False, device_counts=False) (knob names in
# either case; they are read when a step's launches are planned).


def _split(name: str) -> tuple[str, dict]:
    """(the arm's base name, {knob: value}) of an arm name; unknown knobs and bad values are an error."""
    if not name.endswith("]") or " [" not in name:
        return name, {}
    from veloxquant.accelerated import tuning
    base, _, rest = name[:-1].partition(" [")
    raw = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        k, _, v = item.partition("=")
        raw[k.strip()] = v
    try:
        return base, tuning.parse(raw)
    except (TypeError, ValueError) as e:
        raise ValueError(f"arm {name!r}: {e}") from None


@contextlib.contextmanager
def _knobs(name: str):
    """An arm's knobs in effect for the duration of a block (accelerated.tuning.override)."""
    from veloxquant.accelerated import tuning
    with tuning.override(**_split(name)[1]):
        yield


def _arm_names(selected) -> list[str]:
    names = ["fp16 KVCache", "mlx q4 QuantizedKVCache", "mlx q8 QuantizedKVCache", *OURS]
    if selected is None:
        return names
    for n in selected:
        base, knobs = _split(n)
        if base not in names or (knobs and base not in OURS):
            raise ValueError(f"unknown arm {n!r}: arms are {names}, knobs only on ours")
    return list(selected)


def _make(name: str, layers: int):
    name = _split(name)[0]
    import mlx_lm.models.cache as lm

    import veloxquant.accelerated.cache as vc
    if name == "fp16 KVCache":
        return [lm.KVCache() for _ in range(layers)]
    if name.startswith("mlx q"):
        bits = int(name[5])
        return [lm.QuantizedKVCache(group_size=64, bits=bits) for _ in range(layers)]
    kw = dict(OURS[name])
    method = kw.pop("method")
    caches = [vc.VeloxKVCache(method=method, layer=i, seed=1, **kw) for i in range(layers)]
    vc.CacheGroup(caches)
    return caches


def _make_batch(name: str, layers: int, t: int, batch: int, log) -> list:
    """Per layer, a batch of `batch` sequences of t, t - 17, t - 34, ... tokens (so the batch pads), each prefilled
    on its own and merged as mlx-lm's BatchGenerator merges prompt caches (fp16: BatchKVCache; ours: VeloxKVCache
    .merge, one B-row cache where the method allows)."""
    seqs = []
    for j in range(batch):
        one = _make(name, layers)
        _prefill(one, max(1, t - 17 * j), log, seed=1000 * j)
        seqs.append(one)
    return [layer[0].merge(list(layer)) for layer in zip(*seqs)]


def _prefill(caches, t: int, log, seed: int = 0) -> None:
    import mlx.core as mx
    chunk = 4096
    done = 0
    while done < t:
        n = min(chunk, t - done)
        for i, c in enumerate(caches):
            k = mx.random.normal((B, HKV, n, D), key=mx.random.key(seed + done + i)).astype(mx.float16)
            v = mx.random.normal((B, HKV, n, D), key=mx.random.key(seed + done + i + 7919)).astype(mx.float16)
            c.update_and_fetch(k, v)
        mx.eval([c.state for c in caches])
        done += n
    for c in caches:
        if hasattr(c, "check"):
            c.check()


def _step(caches, q, k, v):
    """One decode step through every layer: append a token, attend, feed the output on as the next query. Each
    layer's new key and value wait for the previous layer's output (gpu_clock.gate: one copy kernel per layer,
    the same in every arm), as a model's projections do; without it the GPU runs every layer's append at once,
    ahead of the attention chain."""
    from mlx_lm.models import base
    x = q
    # a batch's mask, made once per step as a model makes it (before the layers' updates): the left padding
    mask = caches[0].make_mask(1) if q.shape[0] > 1 else None
    for i, c in enumerate(caches):
        if i:
            k, v = gpu_clock.gate([k, v], x)
        kk, vv = c.update_and_fetch(k, v)
        x = base.scaled_dot_product_attention(x, kk, vv, cache=c, scale=D ** -0.5, mask=mask)
    return x


def _pipelined(caches, q, k, v, more) -> list[float]:
    """1 + len(more) steps as generate_step runs them: step n + 1 built while step n is evaluated, its query
    step n's output (the next token depends on the last), its key and value from `more`. Returns the host's clock
    when each step was seen done: after the first, their spacing is the steady state of a long generation (no
    first build alone, no last evaluation alone)."""
    import mlx.core as mx
    done = []
    y = _step(caches, q, k, v)
    mx.async_eval(y)
    for kv in more:
        y2 = _step(caches, y, *kv)
        mx.async_eval(y2)
        mx.eval(y)
        done.append(time.perf_counter())
        y = y2
    mx.eval(y)
    done.append(time.perf_counter())
    return done


def _nbytes(caches) -> int:
    return int(sum(c.nbytes for c in caches))


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

    import veloxquant.accelerated.attention as attention
    from veloxquant.accelerated.cache import decode_step
    rows = []
    for t in contexts:
        log(f"context {t}: prefilling {len(arms)} arms x {layers} layers")
        state = {}
        for name in arms:
            t0 = time.perf_counter()
            try:
                if batch > 1:
                    with _knobs(name):          # (SHARED decides at merge which batch cache it is)
                        caches = _make_batch(name, layers, t, batch, log)
                else:
                    caches = _make(name, layers)
                    _prefill(caches, t, log)
                state[name] = caches
                log(f"  {name}: {_nbytes(caches) / layers / 1e6:.1f} MB per layer, {time.perf_counter() - t0:.1f} s")
            except Exception as e:            # e.g. a backend without a kernel for this shape
                rows.append({"context": t, "arm": name, "error": f"{type(e).__name__}: {e}"})
                log(f"  {name}: prefill failed: {type(e).__name__}: {e}")
        pool = [(mx.random.normal((batch, HQ, 1, D), key=mx.random.key(100 + i)).astype(mx.float16),
                 mx.random.normal((batch, HKV, 1, D), key=mx.random.key(200 + i)).astype(mx.float16),
                 mx.random.normal((batch, HKV, 1, D), key=mx.random.key(300 + i)).astype(mx.float16))
                for i in range(POOL)]
        mx.eval(pool)
        times = {n: [] for n in state}
        piped = {n: [] for n in state}
        steady = {n: [] for n in state}
        gpu = {n: [] for n in state}
        gpu_ok, gpu_why = gpu_clock.available()
        gpu_base = gpu_clock.overhead_s(list(pool[0])) if gpu_ok else 0.0
        built = {n: [] for n in state}
        paths = {n: {} for n in state}
        errors = {}
        real_path = attention.path
        real_step = decode_step.DecodeStep.attend
        for it in range(steps + 3):
            order = list(state)
            order = order[it % len(order):] + order[: it % len(order)]
            for name in order:
                if name in errors:
                    continue
                q, k, v = pool[(it + len(times[name])) % POOL]
                seen = paths[name]

                def spy(*a, _seen=seen, **kw):
                    p = real_path(*a, **kw)
                    _seen[p] = _seen.get(p, 0) + 1
                    return p
                def spy_step(self, *a, _seen=seen, **kw):     # the decode step's launch (no path() call)
                    out = real_step(self, *a, **kw)
                    if out is not None:
                        _seen["kernels"] = _seen.get("kernels", 0) + 1
                    return out
                attention.path = spy
                decode_step.DecodeStep.attend = spy_step
                try:
                    with _knobs(name):
                        t0 = time.perf_counter()
                        y = _step(state[name], q, k, v)
                        tb = time.perf_counter() - t0          # the host's build of the graph (Python, MLX calls)
                        mx.eval(y)
                        dt = time.perf_counter() - t0
                        # as generate_step runs it: step n + 1 built while step n is evaluated (its query is
                        # step n's output, as the next token depends on the last), PIPE steps per sample
                        mx.synchronize()
                        more = [pool[(it + j) % POOL][1:] for j in range(1, pipe)]
                        t0 = time.perf_counter()
                        done = _pipelined(state[name], q, k, v, more)
                        dtp = (done[-1] - t0) / pipe
                        dts = statistics.median(b - a for a, b in zip(done, done[1:])) if pipe >= 3 else None
                        # the GPU's own time for the step: its launches all queued behind a hold (gpu_clock)
                        dtg = None
                        if gpu_ok:
                            th = gpu_clock.hold()
                            y = _step(state[name], *gpu_clock.gate([q, k, v], th))
                            te = gpu_clock.stamp(y)
                            mx.eval(th, te, y)
                            dtg = gpu_clock.span_s(th, te) - gpu_base
                except Exception as e:
                    errors[name] = f"{type(e).__name__}: {e}"
                    log(f"  {name}: step failed: {errors[name]}")
                    continue
                finally:
                    attention.path = real_path
                    decode_step.DecodeStep.attend = real_step
                if it >= 3:
                    times[name].append(dt)
                    built[name].append(tb)
                    piped[name].append(dtp)
                    if dts is not None:
                        steady[name].append(dts)
                    if dtg is not None:
                        gpu[name].append(dtg)
        for name in state:
            if name in errors:
                rows.append({"context": t, "arm": name, "error": errors[name]})
                continue
            # memory of one more step: resident cache + the step's transient peak
            caches = state[name]
            q, k, v = pool[0]
            mx.synchronize()
            before = mx.get_active_memory()
            mx.reset_peak_memory()
            with _knobs(name):
                mx.eval(_step(caches, q, k, v))
            transient = mx.get_peak_memory() - before
            # ... and of PIPE steps pipelined as generate_step runs them: a cache whose update cannot reuse a buffer
            # the step in flight still holds copies it here (mlx-lm's KVCache: slice_update without donation)
            mx.synchronize()
            before = mx.get_active_memory()
            mx.reset_peak_memory()
            with _knobs(name):
                _pipelined(caches, q, k, v, [pool[j % POOL][1:] for j in range(1, pipe)])
            transient_piped = mx.get_peak_memory() - before
            ts = sorted(times[name])
            med = statistics.median(ts)
            rows.append({"context": t, "arm": name, "layers": layers, "steps": len(ts), "batch": batch,
                         "step_s": med, "layer_s": med / layers,
                         "pipelined_layer_s": statistics.median(piped[name]) / layers, "pipe": pipe,
                         **({"pipelined_steady_layer_s": statistics.median(steady[name]) / layers}
                            if steady[name] else {}),
                         "build_layer_s": statistics.median(built[name]) / layers,
                         "kv_gated": True,
                         **({"gpu_layer_s": statistics.median(gpu[name]) / layers, "gpu_overhead_s": gpu_base}
                            if gpu[name] else
                            {"gpu_clock": gpu_why}),
                         "layer_s_iqr": (ts[3 * len(ts) // 4] - ts[len(ts) // 4]) / layers,
                         "bytes_per_layer": _nbytes(caches) / layers,
                         "transient_peak_bytes": int(transient),
                         "pipelined_transient_peak_bytes": int(transient_piped), "paths": paths[name]})
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
        del state
        mx.clear_cache()
    return rows


LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=HQ, num_key_value_heads=HKV,
                 head_dim=D, vocab_size=128256)


def _model(n_layers: int, shape: dict | None = None):
    """A random float16 llama of `n_layers` layers, shaped like Llama-3-8B unless `shape` says otherwise."""
    import mlx.core as mx
    from mlx_lm.models import llama
    mx.random.seed(0)
    args = llama.ModelArgs(model_type="llama", num_hidden_layers=n_layers, rms_norm_eps=1e-5, rope_theta=500000.0,
                           tie_word_embeddings=False, **(shape or LLAMA3_8B))
    model = llama.Model(args)
    model.set_dtype(mx.float16)
    mx.eval(model.parameters())
    return model, args


def e2e_suite(contexts, n_layers: int, n_tokens: int, arms: list[str], log, rounds: int = 1) -> list[dict]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    import veloxquant.accelerated.cache as vc
    model, args = _model(n_layers)
    rows = []

    def caches_for(name):
        if name == "fp16 KVCache":
            return None
        return vc.make_prompt_cache(model, seed=1, **dict(OURS[_split(name)[0]]))

    # warm-up: the first step of each arm compiles its kernels (NVRTC, seconds); not part of any timing. The prompt
    # spans a whole prefill chunk (generate_step's 2048 tokens) and a partial one: chunks of 2048 tokens take the
    # encode kernels' compiled-in variants (launches of 4096 rows and more), which a short prompt never compiles
    # (the thirteenth pass's 8k first token took 11.7 s, its 32k one 0.43 s)
    warm = mx.random.randint(0, args.vocab_size, (2048 + 300,), key=mx.random.key(1))
    for name in arms:
        if not name.startswith("mlx q"):
            try:
                with _knobs(name):
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
                with _knobs(name):
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


class _Tokens:
    """The tokenizer batch_generate asks for: no stop tokens (every sequence generates its max_tokens)."""
    eos_token_ids: list = []

    def decode(self, tokens):
        return ""


def batch_suite(contexts, batch_sizes, n_layers: int, n_tokens: int, arms: list[str], log, rounds: int = 1,
                shape: dict | None = None) -> list[dict]:
    """mlx_lm.batch_generate with B prompts of lengths t, t - 17, t - 34, ... (so the batch pads): the batch's
    generation tokens/s (mlx-lm's BatchStats), prompt tokens/s and peak memory; fp16 BatchKVCache (mlx-lm's default)
    against ours handed in as prompt_caches. Arms in turn per round; medians of the rounds."""
    import mlx.core as mx
    from mlx_lm.generate import batch_generate

    import veloxquant.accelerated.cache as vc
    from veloxquant.accelerated.cache import batch as vc_batch
    from veloxquant.accelerated.cache import hook as vc_hook
    model, args = _model(n_layers, shape)
    rows = []
    arms = [a for a in arms if not a.startswith("mlx q")]
    # the attention calls: BatchVeloxKVCache's per sequence (attend_batch calls batch.attend), SharedBatchVeloxKVCache's
    # once per layer for the batch (the hooked dispatch calls hook.attend)
    real_attend = {m: m.attend for m in (vc_batch, vc_hook)}
    for t in contexts:
        for b in batch_sizes:
            prompts = [mx.random.randint(0, args.vocab_size, (max(1, t - 17 * i),), key=mx.random.key(t + i)).tolist()
                       for i in range(b)]
            for rnd, name in [(r, n) for r in range(rounds + 1) for n in arms]:   # round 0: warm-up (JIT), not kept
                given = None if name == "fp16 KVCache" else [
                    vc.make_prompt_cache(model, seed=1, **dict(OURS[_split(name)[0]])) for _ in range(b)]
                seen = {}

                def spy(*a, _seen=seen, _real=real_attend[vc_batch], **kw):   # which attention ran: the decode
                    path = "decode step" if len(a) > 1 and a[1].step is not None else "general"   # step's or another
                    for k in ("attend", path):
                        _seen[k] = _seen.get(k, 0) + 1
                    return _real(*a, **kw)
                mx.synchronize()
                mx.reset_peak_memory()
                vc_batch.attend = spy
                vc_hook.attend = functools.partial(spy, _real=real_attend[vc_hook])
                try:
                    with _knobs(name):
                        r = batch_generate(model, _Tokens(), prompts, max_tokens=n_tokens, prompt_caches=given)
                except Exception as e:
                    rows.append({"context": t, "batch": b, "arm": name, "round": rnd,
                                 "error": f"{type(e).__name__}: {e}"})
                    log(f"  batch {t} x{b} {name}: failed: {type(e).__name__}: {e}")
                    continue
                finally:
                    for m, f in real_attend.items():
                        m.attend = f
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


def _e2e_medians(rows: list[dict]) -> list[dict]:
    """One row per (context, arm): the median tokens/s (and prefill) of its rounds, `rounds_tokens_per_s` all of
    them; an arm whose every round failed keeps its first error. vs_fp16 from the medians."""
    return _round_medians(rows, ("context",), "tokens_per_s", ("prefill_s",))


def _round_medians(rows: list[dict], where: tuple, field: str, medians: tuple = (), maxima: tuple = ()) -> list[dict]:
    """One row per (`where` fields, arm), in first-seen order: the median of `field` over its rounds (all of them in
    `rounds_<field>`), the medians of `medians` and the largest of `maxima`; a round that failed is said
    (`failed_rounds`), an arm whose every round failed keeps its first error; vs_fp16 of `field` against the fp16
    arm with the same `where` fields."""
    out = []
    for key in dict.fromkeys(tuple(r[f] for f in where) + (r["arm"],) for r in rows):
        mine = [r for r in rows if tuple(r[f] for f in where) + (r["arm"],) == key]
        ok = [r for r in mine if field in r]
        if not ok:
            out.append(mine[0])
            continue
        vals = [r[field] for r in ok]
        out.append({**ok[0], field: statistics.median(vals), f"rounds_{field}": vals,
                    **{m: statistics.median(r[m] for r in ok) for m in medians},
                    **{m: max(r[m] for r in ok) for m in maxima}})
        if len(ok) < len(mine):       # a round that failed is said, not dropped silently
            out[-1]["failed_rounds"] = [r["error"] for r in mine if "error" in r]
    for r in out:
        base = next((x for x in out if all(x[f] == r[f] for f in where) and x["arm"] == "fp16 KVCache"
                     and field in x), None)
        if base and field in r:
            r["vs_fp16"] = r[field] / base[field]
    return out


# ---- report ----------------------------------------------------------------------------------------------------
def _ctx(r: dict) -> str:
    """A layer row's context, with its batch (`4096 × 8`: 8 sequences of up to 4096 tokens) where it has one."""
    return f"{r['context']} × {r['batch']}" if r.get("batch", 1) > 1 else f"{r['context']}"


def _us(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def render(res: dict, name: str) -> list[str]:
    dev = res["device"]
    v = res["versions"]
    lines = [f"## Decode step: {dev['name']} ({dev['type']}), {res['date']}", "",
             f"- Versions: mlx {v.get('mlx')}, mlx-lm {v.get('mlx-lm')}, spec {v.get('spec')}, git {v.get('git')}",
             f"- Command: `{res['command']}`",
             f"- Raw data: `{name}`; attention shape B={B}, {HQ} query heads, {HKV} KV heads, d={D}, float16",
             f"- Copy ceiling measured in the same run: {res['copy_bytes_per_s'] / 1e9:.1f} GB/s "
             "(float16 copy, read + write)", ""]
    layer = [r for r in res["layer"] if "layer_s" in r or "error" in r]
    if layer:
        lines += [f"Per-layer decode step (append one token + attention; {layer[0].get('layers', '?')} layers per "
                  "evaluation, median of interleaved steps). `bytes/layer` is the cache as stored, which the step "
                  "reads; `of copy BW` is that over the step time against the copy ceiling; memory is the "
                  "resident cache of the layer plus the step's transient peak (all layers), and in parentheses the "
                  "transient peak of steps pipelined (a cache that copies its buffers then shows it). `pipelined` is "
                  "the same "
                  f"step as generate_step runs it ({layer[0].get('pipe', PIPE)} steps in a row, each built while "
                  "the previous one is evaluated and fed its output as the query), per layer, and in parentheses "
                  "its steady state (the median spacing of the steps' completions after the first: what a long "
                  "generation pays, without the first build and the last evaluation alone; runs before 2026-12-01 "
                  "evening have none); `GPU` is the GPU's own time for the step "
                  "(tools/gpu_clock.py: its launches queued behind a spin, timed by the GPU's clock; CUDA only), so "
                  "`pipelined` above `GPU` means the host limits it; `host build` is the Python "
                  "building the step's graph, part of `time / layer`; old runs have no such columns.", "",
                  "| context | arm | time / layer | × fp16 | IQR | pipelined / layer | × fp16 | GPU / layer | × fp16 | "
                  "host build | bytes / layer | of copy BW | resident + transient | path |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in layer:
            if "error" in r:
                lines.append(f"| {_ctx(r)} | {r['arm']} | failed: {r['error'][:80]} | | | | | | | | | | | |")
                continue
            frac = r["bytes_per_layer"] / r["layer_s"] / res["copy_bytes_per_s"]
            mem = r["bytes_per_layer"] * r["layers"] + r["transient_peak_bytes"]
            piped_mem = (f" (+{r['pipelined_transient_peak_bytes'] / 1e6:.0f} MB pipelined)"
                         if "pipelined_transient_peak_bytes" in r else "")
            paths = ", ".join(f"{k} {n}" for k, n in sorted(r["paths"].items())) or "mlx-lm"
            steady = (f" (steady {_us(r['pipelined_steady_layer_s'])}, "
                      f"{r.get('pipelined_steady_vs_fp16', float('nan')):.2f}×)" if "pipelined_steady_layer_s" in r else "")
            pipe = (f"{_us(r['pipelined_layer_s'])}{steady} | {r.get('pipelined_vs_fp16', float('nan')):.2f}"
                    if "pipelined_layer_s" in r else "— | —")
            gpu = (f"{_us(r['gpu_layer_s'])} | {r.get('gpu_vs_fp16', float('nan')):.2f}"
                   if "gpu_layer_s" in r else "— | —")
            lines.append(f"| {_ctx(r)} | {r['arm']} | {_us(r['layer_s'])} | {r.get('vs_fp16', float('nan')):.2f} | "
                         f"{_us(r['layer_s_iqr'])} | {pipe} | {gpu} | {_us(r['build_layer_s']) if 'build_layer_s' in r else '—'} | "
                         f"{r['bytes_per_layer'] / 1e6:.1f} MB | {frac:.0%} | "
                         f"{mem / 1e6:.0f} MB{piped_mem} | {paths} |")
        lines += ["", "Where the time goes (launch, kernel and host costs measured on the H200): "
                  "[decode-step-analysis.md](decode-step-analysis.md).", ""]
    e2e = res.get("e2e") or []
    if e2e:
        lines += ["End-to-end generation (mlx_lm.generate.generate_step, random Llama-3-8B-shaped model with "
                  f"{e2e[0].get('layers', '?')} layers, greedy): tokens/s of the generated tokens after the first. "
                  "`first token` is the time to the first token (the prompt's prefill; the first context of a "
                  "run also pays the kernels' JIT compilation). With several rounds (arms in turn), the medians "
                  "and each round's tokens/s.", "",
                  "| context | arm | tokens/s | × fp16 | first token | rounds (tokens/s) |", "|---|---|---|---|---|---|"]
        for r in e2e:
            if "error" in r:
                lines.append(f"| {r['context']} | {r['arm']} | failed: {r['error'][:80]} | | | |")
            else:
                each = " / ".join(f"{x:.0f}" for x in r.get("rounds_tokens_per_s", [r["tokens_per_s"]]))
                each += "".join(f" / failed: {e[:60]}" for e in r.get("failed_rounds", []))
                lines.append(f"| {r['context']} | {r['arm']} | {r['tokens_per_s']:.1f} | "
                             f"{r.get('vs_fp16', float('nan')):.2f} | {r['prefill_s']:.2f} s | {each} |")
        lines.append("")
    batch = res.get("batch") or []
    if batch:
        shape = f" (config {json.dumps(res['model_shape'])})" if res.get("model_shape") else ""
        lines += ["Batched generation (mlx_lm.batch_generate, the server's batching; random llama with "
                  f"{batch[0].get('layers', '?')} layers{shape}, greedy, {batch[0].get('tokens_per_sequence', '?')} tokens "
                  "per sequence, prompts of the context length and 17, 34, ... fewer): the batch's generation "
                  "tokens/s (medians of the rounds after a warm-up round), prompt tokens/s and peak memory; `paths`: "
                  "attention calls through the decode step's launch or the general path.", "",
                  "| context | batch | arm | generation tokens/s | × fp16 | prompt tokens/s | peak memory | rounds | paths |",
                  "|---|---|---|---|---|---|---|---|---|"]
        failed = {(r["context"], r["batch"]): True for r in batch if r["arm"] == "fp16 KVCache" and "error" in r}
        for r in batch:
            if "error" in r:
                lines.append(f"| {r['context']} | {r['batch']} | {r['arm']} | failed: {r['error'][:80]} | | | | | |")
                continue
            each = " / ".join(f"{x:.0f}" for x in r.get("rounds_generation_tokens_per_s", []))
            paths = ", ".join(f"{k} {v}" for k, v in r.get("paths", {}).items()) or "mlx-lm"
            vs = f"{r['vs_fp16']:.2f}" if "vs_fp16" in r else "fp16 failed" if failed.get((r["context"], r["batch"])) \
                else ""
            lines.append(f"| {r['context']} | {r['batch']} | {r['arm']} | {r['generation_tokens_per_s']:.1f} | "
                         f"{vs} | {r['prompt_tokens_per_s']:.0f} | "
                         f"{r['peak_memory_bytes'] / 1e9:.2f} GB | {each} | {paths} |")
        lines.append("")
    return lines


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or None where matplotlib is not installed (the plots are optional)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(res: dict, path: pathlib.Path) -> pathlib.Path | None:
    """Per-layer decode-step time against context, one line per arm (log-log): the step evaluated alone and,
    where the run has them, pipelined as generate_step runs it and the GPU's own time (more panels); None
    without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    rows = [r for r in res["layer"] if "layer_s" in r]
    if not rows:
        return None
    panels = [("layer_s", "step evaluated alone")]
    if all("pipelined_layer_s" in r for r in rows):
        panels.append(("pipelined_layer_s", "pipelined (as generate_step)"))
    if all("gpu_layer_s" in r for r in rows):
        panels.append(("gpu_layer_s", "the GPU's own time (gpu_clock)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 4.5), squeeze=False, sharey=True)
    for ax, (key, what) in zip(axes[0], panels):
        for arm in dict.fromkeys(r["arm"] for r in rows):
            pts = sorted((r["context"], r[key] * 1e6) for r in rows if r["arm"] == arm)
            style = dict(color="black", linestyle="--", linewidth=2) if arm.startswith("fp16") else {}
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=arm, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("decode step per layer (µs)")
        ax.set_title(f"{what}, {res['device']['name']} ({res['date'][:10]})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_batch(res: dict, path: pathlib.Path) -> pathlib.Path | None:
    """Batched generation: the batch's generation tokens/s against the batch size, one panel per context, one line
    per arm (an arm that failed, e.g. out of memory, is marked where it failed); None without matplotlib or rows."""
    plt = _pyplot()
    if plt is None:
        return None
    rows = res.get("batch") or []
    contexts = sorted({r["context"] for r in rows})
    if not contexts:
        return None
    fig, axes = plt.subplots(1, len(contexts), figsize=(6.5 * len(contexts), 4.5), squeeze=False)
    for ax, t in zip(axes[0], contexts):
        here = [r for r in rows if r["context"] == t]
        for arm in dict.fromkeys(r["arm"] for r in here):
            style = dict(color="black", linestyle="--", linewidth=2) if arm.startswith("fp16") else {}
            ok = sorted((r["batch"], r["generation_tokens_per_s"]) for r in here
                        if r["arm"] == arm and "generation_tokens_per_s" in r)
            line, = ax.plot([p[0] for p in ok], [p[1] for p in ok], marker="o", label=arm, **style)
            for r in here:
                if r["arm"] == arm and "error" in r:
                    ax.plot([r["batch"]], [0], marker="x", markersize=12, color=line.get_color())
                    ax.annotate(f"{arm}: failed\n({r['error'][:28]}...)", (r["batch"], 0), fontsize=7,
                                xytext=(-90, 12), textcoords="offset points")
        ax.set_xlabel("sequences in the batch")
        ax.set_ylabel("generation tokens/s (whole batch)")
        ax.set_title(f"batch_generate, context {t}, {res['device']['name']} ({res['date'][:10]})")
        ax.set_xticks(sorted({r["batch"] for r in here}))
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plots(res: dict, path: pathlib.Path | None, log) -> None:
    """--plot: the layer suite's plot at `path` and the batch suite's at `path` with -batch before the suffix."""
    if path is None:
        return
    made = [plot(res, path) if res.get("layer") else None,
            plot_batch(res, path.with_name(path.stem + "-batch" + path.suffix)) if res.get("batch") else None]
    for m in made:
        if m is not None:
            log(f"wrote {m}")


def run(args) -> int:
    if args.from_json:
        if not args.markdown:
            print("bench-decode: --from-json needs --markdown", file=sys.stderr)
            return 2
        lines = ["# Decode-step benchmarks", "",
                 "Generated by `veloxquant bench-decode --from-json` (tools/bench_decode.py). Each section is one "
                 "run on one device.", ""]
        for p in args.from_json:
            lines += render(json.loads(p.read_text()), str(p))
        args.markdown.write_text("\n".join(lines) + "\n")
        print(f"wrote {args.markdown}")
        _plots(json.loads(args.from_json[0].read_text()), args.plot, print)
        return 0
    import mlx.core as mx

    from veloxquant.tools.bench_common import device_info
    if args.device == "gpu":
        if not mx.is_available(mx.gpu):
            print("bench-decode: --device gpu, but this MLX build has no GPU", file=sys.stderr)
            return 2
        mx.set_default_device(mx.gpu)
    elif args.device == "cpu":
        mx.set_default_device(mx.cpu)
    log = lambda *a: print(*a, flush=True)   # noqa: E731
    arms = _arm_names(args.arms)
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
