"""Throughput of the fused kernels against the memory: encode and decode of every method over N = 8k..1M
vectors (d = 128, float16 x of shape [1, 8, N/8, 128]), side by side with an fp16 copy and MLX's own
mx.quantize / mx.dequantize (g64, b4), plus one decode step (B=1, H=8, one token) for latency.

Measurement policy as tools/bench/: per group (one N, one op) every arm runs in the same process,
interleaved in a rotating order; iteration i feeds input i mod 10; each call is bracketed by mx.synchronize()
and ends with mx.eval; warm-up dropped; medians and IQRs; ratios are medians of per-iteration ratios to a
baseline timed in the same iteration.

Arms: `fp16 copy` = (x * 1).astype(float16) (reads and writes x once); `mx.quantize g64 b4` /
`mx.dequantize g64 b4`; `kernel <case>` = the fused encode kernel with its fault flags evaluated (no host
sync, no Python framing: KernelMethod.encode_launch) or the decode kernel (decode_tokens), float32 out.
In the decode-step group also `api now <case>` (kernels.encode with its checks raised at once: one host sync)
and `api deferred <case>` (the same inside numerics.deferred_checks(): the flags stay lazy).

Bytes: `x GB/s` = fp16 bytes of x (N*d*2) per second, the issue's "input GB/s"; `moved GB/s` = bytes read
plus bytes written per second (encode: x + the record; decode: the record + float32 out; copy: 2x;
mx.quantize: x + packed codes + fp16 scales and biases). Writes JSON (schema SCHEMA); `veloxquant bench
--from-json` renders it into docs/benchmarks.md with render_run below and tools/bench/plots.py's sweep figure.

Usage: python -m veloxquant.tools.bench.sweep --json PATH [--iters 30] [--warmup 3] [--n 8192 ... 1048576]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from ... import spec

from .._env import utc_now_iso, versions
from .harness import POOL, ROOT, case_of, fmt_s as _fmt_s, interleaved  # noqa: F401

SCHEMA = "veloxquant-bench-kernels-sweep/1"
H, D = 8, 128
NS = [8192, 32768, 131072, 262144, 524288, 1048576]
TARGET_N = 262144                      # the targets apply at N >= 256k
CASES = [
    ("turboquant b=4", "turboquant", dict(bits=4)),
    ("turboquant_rvq b=2+2", "turboquant_rvq", dict(bits=2, bits2=2)),
    ("turboquant_prod b=4", "turboquant_prod", dict(bits=4)),
    ("rabitq", "rabitq", dict()),
    ("kivi b=4 keys G=32", "kivi", dict(bits=4, group_size=32, role="k")),
    ("kivi b=4 values G=32", "kivi", dict(bits=4, group_size=32, role="v")),
    ("mlx_affine b=4 G=64", "mlx_affine", dict(bits=4, group_size=64)),
]
COPY, QUANT, DEQUANT = "fp16 copy", "mx.quantize g64 b4", "mx.dequantize g64 b4"


def _nbytes(out) -> int:
    import mlx.core as mx
    if isinstance(out, mx.array):
        return out.nbytes
    if isinstance(out, dict):
        return sum(_nbytes(v) for v in out.values())
    return sum(_nbytes(v) for v in out)


def group(title: str, n: int, op: str, arms: dict, moved: dict[str, int], warmup: int, iters: int,
          baselines: tuple[str, ...], per_eval: int = 1) -> dict:
    """Times of each arm per call; with per_eval = K each evaluation runs K calls on K different pool inputs
    (as a prefill encodes many layers in one evaluation) and the time is divided by K."""
    if per_eval > 1:
        arms = {name: (lambda i, f=f: [f((i + k) % POOL) for k in range(per_eval)]) for name, f in arms.items()}
    t = {name: [v / per_eval for v in ts] for name, ts in interleaved(arms, warmup, iters).items()}
    xbytes = n * D * 2
    res = {"title": title, "op": op, "n": n, "x_bytes": xbytes, "per_eval": per_eval, "arms": {}}
    for name, v in t.items():
        q1, med, q3 = np.percentile(np.asarray(v), [25, 50, 75])
        s = {"median_s": float(med), "iqr_s": float(q3 - q1), "n": len(v), "moved_bytes": moved[name],
             "x_GBps": xbytes / med / 1e9, "moved_GBps": moved[name] / med / 1e9}
        for base in baselines:
            if base in t and base != name:
                r = np.asarray(v) / np.asarray(t[base])
                rq1, rmed, rq3 = np.percentile(r, [25, 50, 75])
                s[f"ratio_to[{base}]"] = {"median": float(rmed), "iqr": float(rq3 - rq1)}
        res["arms"][name] = s
    return res


def sweep_groups(ns, warmup: int, iters: int, log=print, per_eval: int = 1) -> list[dict]:
    import mlx.core as mx
    from ...accelerated import kernels
    out = []
    for n in ns:
        t = n // H
        shape = (1, H, t, D)
        xs = [mx.random.normal(shape, key=mx.random.key(i)).astype(mx.float16) for i in range(POOL)]
        qs = [mx.quantize(x, group_size=64, bits=4) for x in xs]
        mx.eval(xs, qs)
        enc = {COPY: lambda i: (xs[i] * 1).astype(mx.float16), QUANT: lambda i: mx.quantize(xs[i], group_size=64, bits=4)}
        dec = {COPY: lambda i: (xs[i] * 1).astype(mx.float16),
               DEQUANT: lambda i: mx.dequantize(*qs[i], group_size=64, bits=4)}
        xb = n * D * 2
        moved_e = {COPY: 2 * xb, QUANT: xb + _nbytes(qs[0])}
        moved_d = {COPY: 2 * xb, DEQUANT: _nbytes(qs[0]) + xb}
        for label, method, kw in CASES:
            p = spec.Params(method, window=0, **kw).resolved()
            km = kernels.method_module(method)
            q = p.encoded_tokens(t)
            recs = [km.encode_launch(x, p, q, 0)[0] for x in xs]
            mx.eval([list(r.values()) for r in recs])
            enc[f"kernel {label}"] = lambda i, p=p, km=km, q=q: _flat(km.encode_launch(xs[i], p, q, 0))
            dec[f"kernel {label}"] = lambda i, p=p, km=km, r=recs: km.decode_tokens(r[i], p, D)
            moved_e[f"kernel {label}"] = xb + _nbytes(recs[0])
            moved_d[f"kernel {label}"] = _nbytes(recs[0]) + 4 * n * D
        del recs
        for op, arms, moved, base in (("encode", enc, moved_e, (COPY, QUANT)), ("decode", dec, moved_d, (COPY, DEQUANT))):
            g = group(f"{op}, x [1, {H}, {t}, {D}] float16 (N = {n} vectors)", n, op, arms, moved, warmup, iters, base,
                      per_eval)
            out.append(g)
            a = g["arms"]
            log(f"{op} N={n}: " + ", ".join(f"{k} {v['x_GBps']:.0f}" for k, v in a.items()) + " (x GB/s)", flush=True)
        del xs, qs, enc, dec
        mx.clear_cache()
    return out


def _flat(res) -> list:
    fields, flags = res
    return list(fields.values()) + (list(flags) if flags else [])


def decode_step_group(warmup: int, iters: int, log=print) -> dict:
    """One token per head (a decode step's append of one role of one layer): latency of kernel vs API."""
    import mlx.core as mx
    from ...accelerated import kernels
    from ...accelerated.ops import numerics
    xs = [mx.random.normal((1, H, 1, D), key=mx.random.key(100 + i)).astype(mx.float16) for i in range(POOL)]
    mx.eval(xs)
    arms = {COPY: lambda i: (xs[i] * 1).astype(mx.float16), QUANT: lambda i: mx.quantize(xs[i], group_size=64, bits=4)}

    def deferred(p, i):
        with numerics.deferred_checks() as pending:
            rec = kernels.encode(xs[i], p)
        return list(rec.values()) + [a for _, a, _ in pending]

    for label, method, kw in CASES:
        p = spec.Params(method, window=0, **kw).resolved()
        km = kernels.method_module(method)
        q = p.encoded_tokens(1)       # kivi: 0 (the token waits for its group): the launch only checks it
        arms[f"kernel {label}"] = lambda i, p=p, km=km, q=q: _flat(km.encode_launch(xs[i], p, q, 0))
        arms[f"api now {label}"] = lambda i, p=p: list(kernels.encode(xs[i], p).values())
        arms[f"api deferred {label}"] = lambda i, p=p: deferred(p, i)
    moved = {k: 0 for k in arms}
    g = group(f"encode one decode step, x [1, {H}, 1, {D}] float16", H, "step", arms, moved, warmup, iters, (COPY,))
    log("decode step: " + ", ".join(f"{k} {v['median_s'] * 1e6:.1f} us" for k, v in g["arms"].items()), flush=True)
    return g


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--n", type=int, nargs="+", default=NS)
    ap.add_argument("--per-eval", type=int, default=1,
                    help="calls per evaluation (K different inputs; time divided by K): less of the ~80 us a "
                         "synchronized evaluation costs on the H200 in each arm's time")
    a = ap.parse_args(argv)
    import mlx.core as mx
    from ...accelerated import kernels
    ok, why = kernels.available()
    if not ok:
        print(f"kernels unavailable: {why}")
        return 2
    info = mx.device_info() if hasattr(mx, "device_info") else {}
    t0 = time.perf_counter()
    res = {"schema": SCHEMA, "date": utc_now_iso(), "device": str(mx.default_device()),
           "device_info": {k: str(v) for k, v in dict(info).items()}, "backend": why, "versions": versions(),
           "command": " ".join(["python3 -m veloxquant.tools.bench.sweep"] + sys.argv[1:]),
           "settings": {"warmup": a.warmup, "iters": a.iters, "pool": POOL, "H": H, "d": D, "dtype": "float16",
                        "target_n": TARGET_N, "per_eval": a.per_eval},
           "groups": sweep_groups(a.n, a.warmup, a.iters, print, a.per_eval)}
    res["groups"].append(decode_step_group(a.warmup, a.iters, print))
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {a.json} in {res['wall_s']} s", flush=True)
    return 0


# ---- markdown (docs/benchmarks.md; called by tools/bench/ for results of this SCHEMA) -------------------
def targets(res: dict, resources: list[dict] | None = None) -> list[dict]:
    """Per op and case at the largest N >= target_n: x GB/s, speed-up over mx.quantize / mx.dequantize
    (median of per-iteration time ratios, inverted), moved GB/s as a fraction of the copy's, and the
    verdict against the issue's targets (>= 2x, >= 50%)."""
    rows = []
    tn = res["settings"].get("target_n", TARGET_N)
    for g in res["groups"]:
        if g["op"] not in ("encode", "decode") or g["n"] < tn:
            continue
        base = QUANT if g["op"] == "encode" else DEQUANT
        copy = g["arms"][COPY]
        for arm, s in g["arms"].items():
            case = case_of(arm)
            if case is None:
                continue
            speed = 1 / s[f"ratio_to[{base}]"]["median"]
            frac = s["moved_GBps"] / copy["moved_GBps"]
            rows.append({"op": g["op"], "n": g["n"], "case": case, "x_GBps": s["x_GBps"], "speedup": speed,
                         "moved_GBps": s["moved_GBps"], "copy_fraction": frac, "median_s": s["median_s"],
                         "met": speed >= 2 and frac >= 0.5})
    return rows


def iqr_spread(res: dict) -> dict | None:
    rel = [s["iqr_s"] / s["median_s"] for g in res["groups"] if g["op"] != "step"
           for a, s in g["arms"].items() if case_of(a)]
    times = [s["median_s"] for g in res["groups"] if g["op"] != "step" for a, s in g["arms"].items() if case_of(a)]
    if not rel:
        return None
    return {"n": len(rel), "n_ge_30": sum(r >= 0.3 for r in rel), "lo": min(rel), "hi": max(rel),
            "t_lo": min(times), "t_hi": max(times)}


RESOURCES = "kernel-resources-sm90.json"   # tools/dev/kernel_resources.py output, next to the sweep's JSON


def resources_table(res: dict, json_name: str) -> list[str]:
    """What each kernel costs per thread (ptxas for sm_90, from RESOURCES beside the sweep JSON, if there)
    next to what it reached at the largest N: the numbers behind 'what limits it'."""
    path = (ROOT / json_name).parent / RESOURCES
    if not path.exists():
        return []
    info = json.loads(path.read_text())
    big = {g["op"]: g for g in res["groups"] if g["op"] in ("encode", "decode")
           and g["n"] == max(h["n"] for h in res["groups"] if h["op"] == g["op"])}
    lines = [f"**What the kernels cost** (ptxas for {info.get('arch')}, d = 128, float16 x, {info.get('nvcc')}; "
             f"`{info.get('command')}`; occupancy = resident threads / 2048 for {info.get('block_threads')}-thread "
             f"threadgroups; bytes per row = read + written per token), against the moved GB/s measured at the "
             f"largest N", "",
             "| op | method | registers | smem / threadgroup | spills | occupancy | bytes / row | moved GB/s | "
             "% of copy |", "|---|---|---|---|---|---|---|---|---|"]
    for r in info["rows"]:
        g = big.get(r["kind"])
        cases = [a for a in (g["arms"] if g else {}) if (case_of(a) or "-").split()[0] == r["method"]]
        meas = "; ".join(f"{g['arms'][a]['moved_GBps']:.0f}" for a in cases) if cases else "—"
        frac = ("; ".join(f"{100 * g['arms'][a]['moved_GBps'] / g['arms'][COPY]['moved_GBps']:.0f}%" for a in cases)
                if cases else "—")
        moved = r[f"{r['kind']}_moved"]
        lines.append(f"| {r['kind']} | {r['method']} | {r.get('registers', '?')} | {r.get('smem_bytes', '?')} | "
                     f"{r.get('spill_stores', 0)} | {r['occupancy_256']:.0%} | {moved} | {meas} | {frac} |")
    return lines + [""]


def render_run(res: dict, json_name: str, figure: str | None = None) -> list[str]:

    info, v, st = res.get("device_info", {}), res["versions"], res["settings"]
    name = info.get("device_name", res["device"])
    lines = [f"## GPU ({res.get('backend', '?').lower()}): {name} — fused kernels against the memory, "
             f"N = {min(g['n'] for g in res['groups'] if g['op'] != 'step')}..{max(g['n'] for g in res['groups'])}"
             f" vectors, {res['date']}", "",
             f"- Device: `{res['device']}` — {name}, kernel backend {res.get('backend', '?')}",
             "- Versions: " + ", ".join(f"{k} {v[k]}" for k in ("veloxquant", "spec", "mlx", "numpy", "python", "git")
                                        if v.get(k)),
             f"- Command: `{res['command']}` ({res.get('wall_s', '?')} s)",
             f"- Raw data: `{json_name}` (schema `{res.get('schema')}`); {st['warmup']} warm-up + {st['iters']} "
             f"timed iterations per group, {st['pool']} rotating inputs, {st.get('per_eval', 1)} call(s) per "
             "evaluation (different inputs; time per call); every arm of a table ran interleaved in the same iterations.",
             "- `x GB/s`: fp16 bytes of x (N·d·2) per second. `moved GB/s`: bytes read + written per second "
             "(encode: x + record; decode: record + float32 output; copy: 2·x). `kernel` = the fused kernel "
             "alone, its fault flags evaluated, no host sync.", ""]
    if figure:
        lines += [f"![x GB/s and moved GB/s against N for every method's encode and decode kernel, with the fp16 "
                  f"copy and mx.quantize / mx.dequantize]({figure})", ""]
    rows = targets(res)
    if rows:
        lines += [f"**Targets at N ≥ {st.get('target_n', TARGET_N) // 1024}k** (issue 8): encode ≥ 2× mx.quantize's "
                  "x GB/s and ≥ 50% of the copy's moved GB/s; decode likewise against mx.dequantize. Speed-up = "
                  "1 / median per-iteration time ratio.", "",
                  "| op | N | case | x GB/s | × mx.(de)quantize | moved GB/s | % of copy | met |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['op']} | {r['n']} | {r['case']} | {r['x_GBps']:.0f} | {r['speedup']:.2f} | "
                         f"{r['moved_GBps']:.0f} | {100 * r['copy_fraction']:.0f}% | {'yes' if r['met'] else 'no'} |")
        lines.append("")
    for op in ("encode", "decode"):
        gs = [g for g in res["groups"] if g["op"] == op]
        if not gs:
            continue
        arms = list(gs[0]["arms"])
        lines += [f"**{op}: x GB/s (moved GB/s) by N**", "",
                  "| arm | " + " | ".join(f"N = {g['n']}" for g in gs) + " |", "|---" * (len(gs) + 1) + "|"]
        for arm in arms:
            cells = [f"{g['arms'][arm]['x_GBps']:.0f} ({g['arms'][arm]['moved_GBps']:.0f})" if arm in g["arms"]
                     else "—" for g in gs]
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        lines += ["", f"Medians (IQR) at N = {gs[-1]['n']}: " + "; ".join(
            f"{a} {_fmt_s(s['median_s'])} ({_fmt_s(s['iqr_s'])})" for a, s in gs[-1]["arms"].items()), ""]
    lines += resources_table(res, json_name)
    for g in res["groups"]:
        if g["op"] != "step":
            continue
        lines += [f"**{g['title']}** (latency; `api now` raises its checks at once, one host sync; `api "
                  "deferred` records them inside numerics.deferred_checks())", "",
                  "| arm | median | IQR | ratio vs fp16 copy (IQR) |", "|---|---|---|---|"]
        for arm, s in g["arms"].items():
            r = s.get(f"ratio_to[{COPY}]")
            lines.append(f"| {arm} | {_fmt_s(s['median_s'])} | {_fmt_s(s['iqr_s'])} | "
                         + ("baseline" if r is None else f"{r['median']:.2f} ({r['iqr']:.2f})") + " |")
        lines.append("")
    return lines


if __name__ == "__main__":
    sys.exit(main())
