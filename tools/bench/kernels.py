"""Speed of accelerated.kernels against accelerated.ops (and an fp16 copy, MLX's own affine quantization),
measured side by side by the policy of tools/bench/: per group, all arms in one process, interleaved with
a rotating arm order; iteration i feeds input i mod 10; each call bracketed by mx.synchronize() and ended by
mx.eval; warm-up dropped; medians and IQRs; ratios are per-iteration ratios to a baseline timed in the same
iteration. Writes JSON (docs/bench/h200-kernels.json is one such run); `veloxquant bench --from-json` renders
it into docs/benchmarks.md with render_run below (and tools/bench/plots.py's bench_kernels_plot).

Arms per group: `fp16 copy` and `mx.quantize` / `mx.dequantize` (g64, b4) as in tools/bench/; `ops <m>` =
accelerated.ops; `kernels <m>` = accelerated.kernels' full API (encode: the NaN/Inf check of x and the
norm-overflow check, each a host sync; decode: the record checks, no sync); `kernel only <m>` = the fused
kernel launch alone (encode_launch / decode_tokens, no checks).

Usage: python -m veloxquant.tools.bench.kernels [--json PATH] [--iters N] [--warmup N]
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys


import numpy as np

from ... import spec

from .harness import POOL, arm_kind, fmt_s as _fmt_s, interleaved, parse_title  # noqa: F401

SCHEMA = "veloxquant-bench-kernels/1"
B, H, D = 1, 8, 128
CASES = [
    ("turboquant b=4", "turboquant", dict(bits=4)),
    ("turboquant b=2", "turboquant", dict(bits=2)),
    ("turboquant_rvq b=2", "turboquant_rvq", dict(bits=2)),
    ("rabitq", "rabitq", dict()),
    ("turboquant_prod b=4", "turboquant_prod", dict(bits=4)),
]


def _stats(v) -> dict:
    q1, med, q3 = np.percentile(np.asarray(v), [25, 50, 75])
    return {"median_s": float(med), "iqr_s": float(q3 - q1), "n": len(v)}


def group(title: str, arms: dict, nbytes: int, warmup: int, iters: int, baselines=("fp16 copy",)) -> dict:
    t = interleaved(arms, warmup, iters)
    res = {"title": title, "fp16_bytes": nbytes, "arms": {}}
    for n, v in t.items():
        s = _stats(v)
        s["GBps"] = nbytes / s["median_s"] / 1e9
        for base in baselines:
            if base in t and base != n:
                r = np.asarray(v) / np.asarray(t[base])
                q1, med, q3 = np.percentile(r, [25, 50, 75])
                s[f"ratio_to[{base}]"] = {"median": float(med), "iqr": float(q3 - q1)}
        res["arms"][n] = s
    return res


def run(tokens_list, warmup: int, iters: int) -> list[dict]:
    import mlx.core as mx
    from ...accelerated import kernels, ops
    out = []
    for tokens in tokens_list:
        shape = (B, H, tokens, D)
        nbytes = int(np.prod(shape)) * 2
        xs = [mx.random.normal(shape, key=mx.random.key(i)).astype(mx.float16) for i in range(POOL)]
        mx.eval(xs)
        for label, method, kw in CASES:
            p = spec.Params(method, window=0, **kw).resolved()
            recs = [ops.encode(x, p) for x in xs]
            mx.eval([list(r.values()) for r in recs])
            fields = [{k: v for k, v in r.items() if k != "window"} for r in recs]
            km = kernels.method_module(method)
            enc = {"fp16 copy": lambda i: (xs[i] * 1).astype(mx.float16),   # as tools/bench/
                   "mx.quantize g64 b4": lambda i: mx.quantize(xs[i], group_size=64, bits=4),
                   f"ops {label}": lambda i, p=p: list(ops.encode(xs[i], p).values()),
                   f"kernels {label}": lambda i, p=p: list(kernels.encode(xs[i], p).values()),
                   # the kernel launch alone: no input check, no norm check (each of those is a host sync)
                   f"kernel only {label}": lambda i, p=p: list(km.encode_launch(xs[i], p, tokens).values())}
            qs = [mx.quantize(x, group_size=64, bits=4) for x in xs]
            mx.eval(qs)
            dec = {"fp16 copy": lambda i: (xs[i] * 1).astype(mx.float16),
                   "mx.dequantize g64 b4": lambda i: mx.dequantize(*qs[i], group_size=64, bits=4),
                   f"ops {label}": lambda i, p=p, r=recs: ops.decode(r[i], p),
                   f"kernels {label}": lambda i, p=p, r=recs: kernels.decode(r[i], p),
                   f"kernel only {label}": lambda i, p=p, f=fields: km.decode_tokens(f[i], p, D)}
            base = ("fp16 copy", f"ops {label}")
            out.append(group(f"encode {label}, x {list(shape)} float16", enc, nbytes, warmup, iters, base))
            out.append(group(f"decode {label}, x {list(shape)} float16", dec, nbytes, warmup, iters, base))
            for g in out[-2:]:
                a = g["arms"]
                print(f"{g['title']}: ops {a[f'ops {label}']['median_s'] * 1e6:.1f} us, kernels "
                      f"{a[f'kernels {label}']['median_s'] * 1e6:.1f} us (kernels/ops "
                      f"{a[f'kernels {label}'][f'ratio_to[ops {label}]']['median']:.3f}), kernel only "
                      f"{a[f'kernel only {label}']['median_s'] * 1e6:.1f} us, fp16 copy "
                      f"{a['fp16 copy']['median_s'] * 1e6:.1f} us", flush=True)
    return out


# ---- markdown (docs/benchmarks.md; called by tools/bench/ for results of this SCHEMA) -------------------
def iqr_spread(res: dict, min_tokens: int = 2) -> dict | None:
    """IQR / median of the `kernels` and `kernel only` arms over more than one token: how noisy the short
    kernel timings were (count at >= 30 %, range). None if there are none."""
    rel, times = [], []
    for g in res["groups"]:
        _, label, shape = parse_title(g["title"])
        if shape is None or shape[2] < min_tokens:
            continue
        for arm, s in g["arms"].items():
            if arm_kind(arm, label) in ("kernels", "kernel only"):
                rel.append(s["iqr_s"] / s["median_s"])
                times.append(s["median_s"])
    if not rel:
        return None
    return {"n": len(rel), "n_ge_30": sum(r >= 0.3 for r in rel), "lo": min(rel), "hi": max(rel),
            "t_lo": min(times), "t_hi": max(times)}


def render_run(res: dict, json_name: str, figure: str | None = None) -> list[str]:
    """One section of docs/benchmarks.md: header, figure, one table per group (in the JSON's order)."""

    info, v, st = res.get("device_info", {}), res["versions"], res["settings"]
    name = info.get("device_name", res["device"])
    arch = f", {info['architecture']}" if info.get("architecture") else ""
    lines = [f"## GPU ({res.get('backend', '?').lower()}): {name} — accelerated.kernels vs accelerated.ops, "
             f"{res['date']}", "",
             f"- Device: `{res['device']}` — {name}{arch}, kernel backend {res.get('backend', '?')}",
             "- Versions: " + ", ".join(f"{k} {v[k]}" for k in ("veloxquant", "spec", "mlx", "numpy", "python")
                                        if k in v),
             f"- Command: `{res['command']}`",
             f"- Raw data: `{json_name}` (schema `{res.get('schema')}`); {st['warmup']} warm-up + {st['iters']} "
             f"timed iterations per group, {st['pool']} rotating inputs",
             "- Arms: `ops` = accelerated.ops; `kernels` = accelerated.kernels' full API (encode includes the "
             "NaN/Inf check of x and the norm-overflow check, each a host sync; decode includes the record "
             "checks, no sync); `kernel only` = the fused kernel launch alone (no checks). Ratios are medians "
             "of per-iteration ratios to `fp16 copy` and to `ops` timed in the same iteration (IQR in "
             "parentheses).", ""]
    if figure:
        lines += [f"![kernels throughput on {name}: GB/s of encode and decode per method for ops, kernels and "
                  f"kernel only, with the fp16 copy and mx.quantize / mx.dequantize baselines]({figure})", "",
                  "Throughput over many tokens (log scale; grey lines are the baselines, their median over the "
                  "method groups, the band their range). One-token groups are latency: see their tables.", ""]
    section = None
    for g in res["groups"]:
        op, label, shape = parse_title(g["title"])
        tokens = shape[2] if shape else None
        head = (None if tokens is None else f"### {tokens} tokens per call (throughput)" if tokens > 1
                else "### one token per call (latency: GB/s is not meaningful)")
        if head and head != section:
            lines += [head, ""]
            section = head
        cols = ["arm", "median", "IQR", "GB/s", "ratio vs fp16 copy (IQR)", "ratio vs ops (IQR)", "n"]
        lines += [f"**{g['title']}**", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for arm, s in g["arms"].items():
            ratios = []
            for base in ("fp16 copy", f"ops {label}"):
                r = s.get(f"ratio_to[{base}]")
                ratios.append("baseline" if arm == base else "—" if r is None
                              else f"{r['median']:.2f} ({r['iqr']:.2f})")
            lines.append("| " + " | ".join([arm, _fmt_s(s["median_s"]), _fmt_s(s["iqr_s"]), f"{s['GBps']:.2f}",
                                            *ratios, str(s["n"])]) + " |")
        lines.append("")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 1])
    a = ap.parse_args(argv)
    import mlx.core as mx
    from ...accelerated import kernels
    ok, why = kernels.available()
    if not ok:
        print(f"kernels unavailable: {why}")
        return 2
    info = mx.device_info() if hasattr(mx, "device_info") else {}
    res = {"schema": SCHEMA,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": str(mx.default_device()), "device_info": {k: str(v) for k, v in dict(info).items()},
           "backend": why, "versions": {"mlx": mx.__version__, "python": platform.python_version(),
                                         "numpy": np.__version__, "spec": spec.SPEC_VERSION},
           "command": " ".join(["python -m veloxquant.tools.bench.kernels"] + sys.argv[1:]),
           "settings": {"warmup": a.warmup, "iters": a.iters, "pool": POOL},
           "groups": run(a.tokens, a.warmup, a.iters)}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
