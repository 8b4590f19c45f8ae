"""`veloxquant bench`: speed of the accelerated ops and caches, measured side by side (docs/benchmarks.md).

How we measure (project policy; speed claims come only from here):
- every comparison is one *group*: all its arms (our methods and the baselines) run in the same process,
  interleaved: each iteration runs every arm once, the arm order rotating from one iteration to the next;
- iteration i feeds input i mod P from a pool of P >= 10 distinct inputs, so no arm gets warm caches from
  seeing the same tensor twice in a row;
- each timed call is bracketed by mx.synchronize() and ends with mx.eval of its result (MLX is lazy: without
  this we would time graph building only);
- warm-up iterations (compilation, first allocations) are dropped; we report median and IQR;
- ratios are the median (and IQR) of the per-iteration ratios arm / baseline, both timed in the same
  iteration. Absolute times mean something only on the GPU; on a CPU read the ratios.

Suites: `ops` (accelerated.ops encode/decode vs an fp16 copy and mx.quantize/mx.dequantize) and `cache`
(update_and_fetch of one token after a prefill vs mlx-lm's KVCache and QuantizedKVCache; needs mlx-lm).
"""
from __future__ import annotations

import functools
import json
import pathlib
import shlex
import sys
import time

import numpy as np

from ... import spec

from .._env import utc_now_iso, versions
from .harness import POOL, ROOT, device_info, fmt_s as _fmt_s, interleaved, use_device

B, H, D = 1, 8, 128
FP16 = 2                   # bytes per fp16 element: GB/s is of the fp16-equivalent tensor
REF_GROUP, REF_BITS = 64, 4  # MLX's own affine quantization, the reference arm

# (label, method, spec.Params keywords) for the ops suite. KIVI uses window 0 so the whole input is encoded.
OPS_CASES = [
    ("turboquant b=2", "turboquant", dict(bits=2)),
    ("turboquant b=4", "turboquant", dict(bits=4)),
    ("turboquant_rvq b=2", "turboquant_rvq", dict(bits=2)),
    ("turboquant_prod b=4", "turboquant_prod", dict(bits=4)),
    ("kivi b=2 keys", "kivi", dict(bits=2, window=0, role="k")),
    ("kivi b=2 values", "kivi", dict(bits=2, window=0, role="v")),
    ("rabitq", "rabitq", dict()),
    ("mlx_affine b=4", "mlx_affine", dict(bits=4)),
]
# (label, method, cache keywords) for the cache suite: each method's class with its default window.
CACHE_CASES = [
    ("TurboQuantKVCache b=2", "turboquant", dict(bits=2)),
    ("TurboQuantKVCache b=4", "turboquant", dict(bits=4)),
    ("TurboQuantRVQKVCache b=2", "turboquant_rvq", dict(bits=2)),
    ("TurboQuantProdKVCache b=4", "turboquant_prod", dict(bits=4)),
    ("KIVIKVCache b=2", "kivi", dict(bits=2)),
    ("RaBitQKVCache", "rabitq", dict()),
]
SETTINGS = {  # iterations per group; --quick must finish in < 2 min on a 2-core CPU
    "quick": dict(tokens=4096, contexts=[1024, 4096], warmup=2, iters=10),
    "full": dict(tokens=4096, contexts=[1024, 4096], warmup=5, iters=50),
}


def add_arguments(p) -> None:
    p.add_argument("--device", choices=["cpu", "gpu"], default=None, help="default: MLX's default device")
    p.add_argument("--methods", nargs="+", choices=spec.METHODS, default=list(spec.METHODS))
    p.add_argument("--suites", nargs="+", choices=["ops", "cache"], default=["ops", "cache"])
    p.add_argument("--quick", action="store_true", help="fewer iterations (CPU smoke run, < 2 min)")
    p.add_argument("--json", type=pathlib.Path, default=None, help="write the results here")
    p.add_argument("--markdown", type=pathlib.Path, default=None, help="write docs/benchmarks.md-style tables")
    p.add_argument("--from-json", type=pathlib.Path, nargs="+", default=None, metavar="JSON",
                   help="measure nothing: render these result files (e.g. GPU and CPU runs, and "
                        "tools/bench/kernels.py JSON) into --markdown")


# ---- timing ------------------------------------------------------------------------------------------
def _median_iqr(v) -> tuple[float, float]:
    q1, med, q3 = np.percentile(np.asarray(v, dtype=np.float64), [25, 50, 75])
    return float(med), float(q3 - q1)


def summarise(times: dict, baseline: str, nbytes: int, common: dict, meta: dict, log) -> list[dict]:
    """One row per arm: median/IQR seconds, GB/s of `nbytes`, and the paired ratio to `baseline`."""
    base = np.asarray(times[baseline])
    rows = []
    for arm, t in times.items():
        med, iqr = _median_iqr(t)
        r_med, r_iqr = _median_iqr(np.asarray(t) / base)
        row = {**common, **meta.get(arm, {"method": "baseline", "params": {}}), "arm": arm,
               "median_s": med, "iqr_s": iqr, "n": len(t), "GB/s": nbytes / med / 1e9,
               "baseline": baseline, "ratio": r_med, "ratio_iqr": r_iqr}
        rows.append(row)
        log(f"  {common['suite']:5} {common['op']:16} T={common['shape'][2]:<5} {arm:34} "
            f"{med * 1e3:9.3f} ms (IQR {iqr * 1e3:.3f})  {row['GB/s']:7.3f} GB/s  x{r_med:.2f} vs {baseline}")
    return rows


def _pool(shape, seed: int):
    """POOL distinct float16 tensors (Gaussian, a realistic spread of K/V values), evaluated."""
    import mlx.core as mx

    keys = mx.random.split(mx.random.key(seed), POOL)
    xs = [mx.random.normal(shape, key=k).astype(mx.float16) for k in keys]
    mx.eval(xs)
    return xs


# ---- suites --------------------------------------------------------------------------------------------
def ops_suite(cases, cfg: dict, log) -> list[dict]:
    """Encode (T tokens and one decode step) and decode (T tokens) of each method, side by side with an
    fp16 copy and MLX's own affine quantize/dequantize."""
    import mlx.core as mx

    from ...accelerated import ops

    rows = []
    t = cfg["tokens"]
    for op, shape in (("encode", (B, H, t, D)), ("encode", (B, H, 1, D)), ("decode", (B, H, t, D))):
        xs = _pool(shape, seed=shape[2])
        log(f"ops: {op} {shape} ...")
        arms = {"fp16 copy": lambda i: (xs[i] * 1).astype(mx.float16)}
        ref = {"group_size": REF_GROUP, "bits": REF_BITS}
        meta = {f"mx.{q} g{REF_GROUP} b{REF_BITS}": {"method": f"mx.{q}", "params": ref}
                for q in ("quantize", "dequantize")}
        if op == "encode":
            arms[f"mx.quantize g{REF_GROUP} b{REF_BITS}"] = (
                lambda i: mx.quantize(xs[i], group_size=REF_GROUP, bits=REF_BITS))
        else:
            qs = [mx.quantize(x, group_size=REF_GROUP, bits=REF_BITS) for x in xs]
            mx.eval(qs)
            arms[f"mx.dequantize g{REF_GROUP} b{REF_BITS}"] = (
                lambda i: mx.dequantize(*qs[i], group_size=REF_GROUP, bits=REF_BITS))
        for label, method, kw in cases:
            p = spec.Params(method, **kw).resolved()
            if p.encoded_tokens(shape[2]) == 0:
                log(f"  ops   {op:16} T={shape[2]:<5} {label:34} skipped: encodes no token at T={shape[2]} "
                    f"(group of {p.group_size} tokens)")
                continue
            if op == "encode":
                arms[label] = functools.partial(lambda p, i: ops.encode(xs[i], p), p)
            else:
                recs = [ops.encode(x, p) for x in xs]
                mx.eval(recs)
                arms[label] = functools.partial(lambda p, recs, i: ops.decode(recs[i], p), p, recs)
            meta[label] = {"method": method, "params": p.to_dict()}
        log(f"  {len(arms)} arms interleaved")
        times = interleaved(arms, cfg["warmup"], cfg["iters"])
        common = {"suite": "ops", "op": op, "shape": list(shape)}
        rows += summarise(times, "fp16 copy", int(np.prod(shape)) * FP16, common, meta, log)
        del xs, arms
    return rows


def cache_suite(cases, cfg: dict, log) -> tuple[list[dict], str | None]:
    """update_and_fetch of one token per call after a prefill of `context` tokens, each cache class vs
    mlx-lm's KVCache (the baseline) and QuantizedKVCache. Returns (rows, reason it was skipped or None)."""
    try:
        import mlx_lm.models.cache as lm

        from ...accelerated import cache as vc
    except ImportError as e:  # our caches subclass mlx-lm's, so without mlx-lm there is nothing to time
        return [], f"mlx-lm is not installed ({e})"
    import mlx.core as mx

    rows = []
    for ctx in cfg["contexts"]:
        ks, vs = _pool((B, H, 1, D), seed=1000 + ctx), _pool((B, H, 1, D), seed=2000 + ctx)
        k0, v0 = (mx.random.normal((B, H, ctx, D), key=mx.random.key(s)).astype(mx.float16) for s in (1, 2))
        caches = {"mlx_lm KVCache": lm.KVCache(),
                  "mlx_lm QuantizedKVCache g64 b4": lm.QuantizedKVCache(group_size=64, bits=4),
                  "mlx_lm QuantizedKVCache g64 b8": lm.QuantizedKVCache(group_size=64, bits=8)}
        meta = {f"mlx_lm QuantizedKVCache g64 b{b}": {"method": "mlx_lm.QuantizedKVCache",
                                                     "params": {"group_size": 64, "bits": b}} for b in (4, 8)}
        for label, method, kw in cases:
            caches[label] = vc.CLASS_BY_METHOD[method](**kw)
            meta[label] = {"method": method, "params": {"key": caches[label].key_params.to_dict(),
                                                        "value": caches[label].value_params.to_dict()}}
        for c in caches.values():
            mx.eval(c.update_and_fetch(k0, v0))  # prefill (untimed)
        arms = {name: functools.partial(lambda c, i: c.update_and_fetch(ks[i], vs[i]), c)
                for name, c in caches.items()}
        log(f"cache: update_and_fetch after {ctx} tokens, {len(arms)} arms interleaved ...")
        times = interleaved(arms, cfg["warmup"], cfg["iters"])
        common = {"suite": "cache", "op": "update_and_fetch", "shape": [B, H, ctx, D], "context": ctx}
        # GB/s: fp16-equivalent bytes of the keys and values a step returns (the whole context).
        rows += summarise(times, "mlx_lm KVCache", 2 * B * H * ctx * D * FP16, common, meta, log)
        del caches, arms
    return rows, None


# ---- environment ---------------------------------------------------------------------------------------
# ---- markdown -----------------------------------------------------------------------------------------
def _table(rows: list[dict], absolute: bool) -> list[str]:
    base = rows[0]["baseline"]
    head = ["arm", "params", f"time / {base} (median)", "ratio IQR"]
    if absolute:
        head += ["median", "IQR", "GB/s"]
    head.append("n")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        params = r["params"]
        if "key" in params:  # cache: show the key stream's settings (values differ only by role)
            params = params["key"]
        hide = {"method", "seed", "layer", "head_offset"} | ({"role"} if r["method"] != "kivi" else set())
        ptxt = ", ".join(f"{k}={v}" for k, v in params.items() if k not in hide)
        cells = [r["arm"], ptxt, f"{r['ratio']:.2f}", f"{r['ratio_iqr']:.2f}"]
        if absolute:
            cells += [_fmt_s(r["median_s"]), _fmt_s(r["iqr_s"]), f"{r['GB/s']:.2f}"]
        cells.append(str(r["n"]))
        out.append("| " + " | ".join(cells) + " |")
    return out


def render_run(res: dict, json_name: str, figure: str | None = None) -> list[str]:
    dev, v = res["device"], res["versions"]
    gpu = dev["type"] == "gpu"
    kind = f"GPU ({dev['backend']}): {dev['name']}" if gpu else f"CPU: {dev['name']}, {dev['cpu_count']} cores"
    lines = [f"## {kind} — {'quick' if res['quick'] else 'full'} run, {res['date']}", ""]
    if not gpu:
        lines += ["**CPU run.** Absolute times from this machine say nothing about GPU speed and are left "
                  "out of the tables (they are in the JSON); only the ratios within a table are meaningful, "
                  "and even they shift on a GPU.", ""]
    lines += [f"- Device: `{dev['default_device']}` — {dev['name']}",
              "- Versions: " + ", ".join(f"{k} {v[k]}" for k in ("veloxquant", "spec", "mlx", "mlx-lm",
                                                                 "numpy", "python") if k in v)
              + (f" (git {v['git']})" if v.get("git") else ""),
              f"- Command: `{res['command']}`",
              f"- Raw data: `{json_name}`; {res['settings']['warmup']} warm-up + {res['settings']['iters']} "
              f"timed iterations per group, {POOL} rotating inputs", ""]
    if figure:
        lines += [f"![ops throughput on {dev['name']}: GB/s of encode and decode per method, with the fp16 copy "
                  f"and mx.quantize / mx.dequantize baselines]({figure})", "",
                  "Throughput of the ops suite over many tokens (log scale; hatched grey bars are the baselines; "
                  "encode of one token is latency, see its table). Our decode writes float32, twice the bytes "
                  "of `mx.dequantize`.", ""]
    groups: dict[tuple, list[dict]] = {}
    for r in res["measurements"]:
        groups.setdefault((r["suite"], r["op"], tuple(r["shape"])), []).append(r)
    for suite, title in (("ops", "ops: accelerated.ops encode / decode"),
                         ("cache", "cache: update_and_fetch of one token (K and V)")):
        lines += [f"### {title}", ""]
        if suite in res.get("skipped", {}):
            lines += [f"Skipped: {res['skipped'][suite]}.", ""]
        for (s, op, shape), rows in groups.items():
            if s != suite:
                continue
            what = (f"{op}, x of shape {list(shape)} float16" if suite == "ops"
                    else f"after a prefill of {shape[2]} tokens, H={shape[1]}, d={shape[3]}, float16")
            lines += [f"**{what}**", ""] + _table(rows, absolute=gpu) + [""]
    return lines


NOTES = """\
## How to read these tables

- Every table is one group measured side by side: all its arms ran in one process, interleaved (each
  iteration runs every arm once, in a rotating order), each call on the next of 10 distinct inputs, with
  `mx.synchronize()` before and `mx.eval` + `mx.synchronize()` after each timed call. Warm-up iterations
  are dropped.
- `time / baseline` is the median over iterations of (arm time / baseline time in the same iteration);
  below 1 is faster than the baseline. `ratio IQR` is the interquartile range of those per-iteration ratios.
- ops baseline: `fp16 copy` = `(x * 1).astype(float16)`, i.e. just reading and writing the fp16 tensor once.
  `mx.quantize` / `mx.dequantize` (group 64, 4 bits) is MLX's own affine quantizer, for reference.
  GB/s = fp16-equivalent bytes of x (B·H·T·d·2) per second. Our `decode` returns float32 (spec), so it writes
  twice the bytes that `mx.dequantize` (float16) does. Encode at T=1 is the per-token cost of a decode step;
  KIVI encodes whole groups of G=32 tokens only (spec/streaming.md: Q(T) = G·⌊(T − R)/G⌋, both roles), so
  at T=1 it encodes nothing and is skipped (in a cache the token waits in the window until a group fills).
- cache baseline: mlx-lm's `KVCache`. Our caches store only the compressed records and decode all tokens on
  every `update_and_fetch` (no dequantized copy is kept), so their step time grows with the context.
  mlx-lm's `QuantizedKVCache` returns quantized tuples for `mx.quantized_matmul` attention, not dequantized
  arrays, so it does less work per step than a cache feeding unchanged attention. Caches use each method's
  default window (KIVI: 128 tokens); the context grows by one token per timed call (at most warm-up + n).
  GB/s = fp16-equivalent bytes of the keys and values returned (2·B·H·context·d·2) per second; KVCache
  returns views of its buffers (it only writes the new token), so its GB/s is no memory bandwidth.
- Needs mlx-lm for the cache suite; without it the suite is skipped (our caches subclass mlx-lm's).
"""


def _is_kernels(res: dict) -> bool:
    """A result of tools/bench/kernels.py (accelerated.kernels vs accelerated.ops), not of this module."""
    from . import kernels as bench_kernels

    return res.get("schema") == bench_kernels.SCHEMA



def _is_decode(res: dict) -> bool:
    """A tools/bench/decode.py run (per-layer decode step and end-to-end generation)."""
    return "layer" in res and "copy_bytes_per_s" in res


def _is_sweep(res: dict) -> bool:
    """A result of tools/bench/sweep.py (kernels against the memory, N = 8k..1M vectors)."""
    from . import sweep as bench_sweep

    return res.get("schema") == bench_sweep.SCHEMA


def _is_pytest_benchmark(res: dict) -> bool:
    """A `pytest benchmarks --benchmark-json` result (benchmarks/test_bench_ops.py: MLX ops vs reference)."""
    return "benchmarks" in res and "machine_info" in res


def render_pytest_benchmark(res: dict, json_name: str, figure: str | None = None) -> list[str]:
    """MLX ops path vs the numpy reference on the CPU (issue: pytest-benchmark, every method)."""
    cpu = res["machine_info"].get("cpu", {}).get("brand_raw", "CPU")
    rows: dict[tuple[str, str], dict[str, dict]] = {}
    for b in res["benchmarks"]:
        prm = b["params"]
        rows.setdefault((prm["method"], prm["op"]), {})[prm["impl"]] = b["stats"]
    lines = [f"## CPU: {cpu}: MLX ops path vs numpy reference (pytest-benchmark), {res['datetime'][:19]}", "",
             f"- Command: `pytest benchmarks --benchmark-only --benchmark-json {json_name}`; "
             f"pytest-benchmark {res['version']}; raw data: `{json_name}`",
             "- Shapes: B=1, H=8, T=256, d=128, float16 input (benchmarks/test_bench_ops.py). pytest-benchmark "
             "runs one arm after the other (not interleaved, one input), so the ratio is indicative only.", "",
             "| method | op | mlx_ops median | reference median | reference / mlx_ops |",
             "|---|---|---|---|---|"]
    for (method, op), arms in sorted(rows.items()):
        m, r = arms.get("mlx_ops"), arms.get("reference")
        ratio = f"{r['median'] / m['median']:.2f}" if m and r else "—"
        lines.append(f"| {method} | {op} | {_fmt_s(m['median']) if m else '—'} | "
                     f"{_fmt_s(r['median']) if r else '—'} | {ratio} |")
    return lines + [""]


def reading_notes(results: list[tuple[dict, str]]) -> list[str]:
    """'Reading these numbers' at the top: what the ratios are and, from the data, how noisy short GPU
    timings were (so nobody reads a 10 % difference inside a 60 % IQR as a result)."""
    from . import kernels as bench_kernels

    text = ("**Reading these numbers.** Ratios are medians of per-iteration ratios between arms timed "
            "interleaved in the same iterations of the same process, not ratios of separately measured medians; "
            "compare arms within a table, not across sections.")
    for res, name in results:
        if _is_sweep(res):
            from . import sweep as bench_sweep
            sp = bench_sweep.iqr_spread(res)
            if sp:
                text += (f" In the sweep `{name}`, {sp['n_ge_30']} of the {sp['n']} kernel arms (medians "
                         f"{_fmt_s(sp['t_lo'])} – {_fmt_s(sp['t_hi'])}) had an IQR of 30% of their median or more "
                         f"(range {sp['lo']:.0%}–{sp['hi']:.0%}).")
            continue
        if not _is_kernels(res):
            continue
        text += (" In the kernels run, `kernels` is accelerated.kernels' full API and includes its input "
                 "validation syncs (the NaN/Inf check of x and the norm-overflow check on encode), while "
                 "`kernel only` times the fused kernel launch alone.")
        sp = bench_kernels.iqr_spread(res)
        if sp:
            often = ("often 30–100% of the median" if 2 * sp["n_ge_30"] >= sp["n"]
                     else "mostly under 30% of the median")  # the lead-in follows the counts below
            text += (f" IQRs on the GPU were {often} for short kernels: in `{name}`, "
                     f"{sp['n_ge_30']} of the {sp['n']} `kernels` / `kernel only` arms over many tokens (medians "
                     f"{_fmt_s(sp['t_lo'])} – {_fmt_s(sp['t_hi'])}) had an IQR of 30% of their median or "
                     f"more (range {sp['lo']:.0%}–{sp['hi']:.0%}); trust only differences well outside "
                     f"the IQR.")
    return [text, ""]


def render_markdown(results: list[tuple[dict, str]], figures: dict[str, str] | None = None) -> str:
    """`figures`: JSON name -> PNG path relative to the markdown, embedded at the top of that run."""
    from . import kernels as bench_kernels

    lines = ["# Benchmarks", "",
             "Generated by `veloxquant bench` (tools/bench/). Each section below is one run on one device; "
             "figures from different sections are not comparable with each other.", ""]
    lines += reading_notes(results)
    from . import decode as bench_decode
    for res, name in results:
        if _is_decode(res):
            fig = (figures or {}).get(name)
            lines += bench_decode.render(res, name) + ([f"![decode step per layer]({fig})", ""] if fig else [])
            continue
        from . import sweep as bench_sweep
        render = (bench_kernels.render_run if _is_kernels(res) else bench_sweep.render_run if _is_sweep(res) else
                  render_pytest_benchmark if _is_pytest_benchmark(res) else render_run)
        lines += render(res, name, (figures or {}).get(name))
    return "\n".join(lines) + "\n" + NOTES


def write_figures(results: list[tuple[dict, str]], folder: pathlib.Path, log=print) -> dict[str, str]:
    """One PNG per GPU run (CPU times say nothing about speed) named after the device, e.g.
    benchmarks-h200.png; a second run on the same device is named after its JSON file instead. A
    tools/bench/kernels.py run gets benchmarks-<device>-kernels.png, a tools/bench/sweep.py run
    benchmarks-<device>-kernels-sweep.png."""
    from . import plots

    from . import decode as bench_decode
    out: dict[str, str] = {}
    for res, name in results:
        if _is_decode(res):      # tools/bench/decode.py: benchmarks-<device>-decode.png
            dev = res["device"].get("name", res["device"].get("type", "gpu"))
            slug = _slug(dev.lower().replace("nvidia", "").replace("apple", "")) + "-decode"
            png = bench_decode.plot(res, folder / f"benchmarks-{slug}.png")
            log(f"wrote {png}" if png else f"plot for {name} skipped (no matplotlib or no rows)")
            if png:
                out[name] = png.name
            continue
        if _is_kernels(res):  # kernels run only where they can (a GPU): benchmarks-<device>-kernels.png
            dev, suffix = res.get("device_info", {}).get("device_name", "gpu"), "-kernels"
            plot = plots.bench_kernels_plot
        elif _is_sweep(res):  # benchmarks-<device>-kernels-sweep.png
            dev, suffix = res.get("device_info", {}).get("device_name", "gpu"), "-kernels-sweep"
            plot = plots.bench_sweep_plot
        elif _is_pytest_benchmark(res) or res["device"]["type"] != "gpu":
            continue
        else:
            dev, suffix, plot = res["device"]["name"], "", plots.bench_plot
        slug = _slug(dev.lower().replace("nvidia", "").replace("apple", "")) + suffix
        if f"benchmarks-{slug}.png" in out.values():
            slug = _slug(pathlib.Path(name).stem)
        png, why = plot(res, folder / f"benchmarks-{slug}.png")
        log(f"wrote {png}" if png else f"plot for {name} skipped: {why}")
        if png:
            out[name] = png.name
    return out


def _slug(s: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in s).split()) or "gpu"


def _rel(path: pathlib.Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# ---- entry point ------------------------------------------------------------------------------------------
def run(args) -> int:
    if args.from_json:
        if not args.markdown:
            print("bench: --from-json needs --markdown", file=sys.stderr)
            return 2
        results = [(json.loads(p.read_text()), _rel(p)) for p in args.from_json]
        figures = write_figures(results, args.markdown.parent)
        args.markdown.write_text(render_markdown(results, figures))
        print(f"wrote {args.markdown}")
        return 0

    if not use_device(args.device, "bench"):
        return 2
    cfg = SETTINGS["quick" if args.quick else "full"]
    log = functools.partial(print, flush=True)
    res = {"command": " ".join(["veloxquant", *map(shlex.quote, sys.argv[1:])])
           if sys.argv[0].endswith("veloxquant") else " ".join(["python3 -m veloxquant.tools.cli",
                                                                 *map(shlex.quote, sys.argv[1:])]),
           "date": utc_now_iso(), "device": device_info(), "versions": versions(), "quick": bool(args.quick),
           "settings": {**cfg, "pool": POOL, "B": B, "H": H, "d": D, "dtype": "float16"},
           "methods": list(args.methods), "skipped": {}, "measurements": []}
    log(f"bench on {res['device']['default_device']} ({res['device']['name']}), "
        f"{'quick' if args.quick else 'full'} settings {cfg}")
    t0 = time.perf_counter()
    if "ops" in args.suites:
        res["measurements"] += ops_suite([c for c in OPS_CASES if c[1] in args.methods], cfg, log)
    if "cache" in args.suites:
        rows, reason = cache_suite([c for c in CACHE_CASES if c[1] in args.methods], cfg, log)
        if reason:
            log(f"cache suite skipped: {reason}")
            res["skipped"]["cache"] = reason
        res["measurements"] += rows
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    log(f"done in {res['wall_s']} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1) + "\n")
        log(f"wrote {args.json}")
    if args.markdown:
        name = _rel(args.json) if args.json else "(no JSON written)"
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        figures = write_figures([(res, name)], args.markdown.parent, log)
        args.markdown.write_text(render_markdown([(res, name)], figures))
        log(f"wrote {args.markdown}")
    return 0
