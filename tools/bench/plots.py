"""Figures for docs/: quality (KL vs bits/coord) and benchmark throughput (GB/s per arm), from the JSON.

matplotlib is optional (`pip install veloxquant[plots]`): every function returns (path, None) when it wrote
the PNG and (None, reason) when it could not, so the tools still write their JSON and markdown without it.
The Agg backend renders to files only (no display needed on servers).
"""
from __future__ import annotations

import pathlib
import statistics

# Same colour and marker for a method in every figure.
STYLE = {
    "turboquant": ("tab:blue", "o"), "turboquant_rvq": ("tab:orange", "s"),
    "turboquant_prod": ("tab:green", "^"), "kivi": ("tab:red", "D"), "rabitq": ("tab:purple", "P"),
    "mlx_affine": ("tab:brown", "v"),
}
BASELINE_COLOUR = "0.55"



GBPS_TICKS = (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


def _gbps_axis(plt, ax, lo: float, hi: float, tick_values, title: str) -> None:
    """The log GB/s x axis shared by the benchmark figures: limits with margins, round-number ticks."""
    ax.set_xscale("log")
    ax.set_xlim(lo / 1.6, hi * 2.2)
    ticks = [t for t in tick_values if lo / 1.6 <= t <= hi * 2.2]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("GB/s (fp16-equivalent bytes of x per second, log)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.set_axisbelow(True)

def _pyplot():
    """matplotlib.pyplot on the Agg backend, or None if matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, plt, path: pathlib.Path) -> pathlib.Path:
    """The figure as a 256-colour palette PNG: a third of matplotlib's RGBA bytes for the same plot (antialiased
    edges within a few levels), so the figures under docs/ keep the tracked tree small (issue 31). Fixed
    metadata and a deterministic quantizer: regenerating from the same JSON gives the same bytes."""
    import io

    from PIL import Image     # matplotlib's own dependency

    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    img = Image.open(buf).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    img.save(path, format="PNG", optimize=True, dpi=(110, 110))
    return path


def quality_plot(result: dict, path: pathlib.Path) -> tuple[pathlib.Path | None, str | None]:
    """KL mean (log y) vs measured bits/coord: one line per method, one panel per head dim."""
    plt = _pyplot()
    if plt is None:
        return None, "matplotlib is not installed"
    rows = result["results"]
    dims = sorted({r["head_dim"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, len(dims), figsize=(5.6 * len(dims), 4.6), sharey=True, squeeze=False)
    for ax, d in zip(axes[0], dims):
        for m in methods:
            # KL 0 (nothing encoded yet, e.g. a prompt shorter than the KIVI group) has no place on a log axis.
            pts = sorted((r["bits_per_coord"], r["kl_mean"], r["bits"]) for r in rows
                         if r["method"] == m and r["head_dim"] == d and r["kl_mean"] > 0)
            if not pts:
                continue
            colour, marker = STYLE.get(m, (None, "o"))
            x, y, b = zip(*pts)
            ax.plot(x, y, marker=marker, color=colour, label=m, linewidth=1.4, markersize=6)
            for xi, yi, bi in pts:  # the configured bit width next to each point
                ax.annotate(f"{bi}", (xi, yi), textcoords="offset points", xytext=(4, 3), fontsize=7,
                            color=colour)
        if ax.lines:
            ax.set_yscale("log")
        ax.set_title(f"head dim {d}")
        ax.set_xlabel("measured bits per coordinate (cache nbytes × 8 / coordinates)")
        ax.grid(True, which="major", alpha=0.35)
        ax.grid(True, which="minor", axis="y", alpha=0.12)
    axes[0][0].set_ylabel("mean KL(fp16 ‖ method), nats (log)")
    if axes[0][-1].lines:
        axes[0][-1].legend(title="method (labels: bits)", fontsize=8, title_fontsize=8)
    s = result.get("settings", {})
    fig.suptitle("Next-token KL vs the fp16 KVCache — random 2-layer mlx-lm llama, "
                 f"window R={s.get('window', '?')}, {result.get('device', '')}, {result.get('date', '')[:10]}",
                 fontsize=10)
    fig.tight_layout()
    return _save(fig, plt, path), None


def bench_plot(res: dict, path: pathlib.Path) -> tuple[pathlib.Path | None, str | None]:
    """GB/s per arm of the ops suite's encode and decode over many tokens (horizontal bars, log x)."""
    plt = _pyplot()
    if plt is None:
        return None, "matplotlib is not installed"
    ops = [r for r in res["measurements"] if r["suite"] == "ops"]
    groups = {}
    for r in ops:
        groups.setdefault((r["op"], tuple(r["shape"])), []).append(r)
    # Encode at T=1 is latency (per-token cost), not throughput: its GB/s would only mislead here.
    panels = [(k, v) for k, v in groups.items() if k[1][2] > 1]
    if not panels:
        return None, "no ops measurements over more than one token"
    n = max(len(v) for _, v in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 0.42 * n + 1.9), squeeze=False)
    lo = min(r["GB/s"] for _, v in panels for r in v)
    hi = max(r["GB/s"] for _, v in panels for r in v)
    for ax, ((op, shape), rows) in zip(axes[0], panels):
        rows = rows[::-1]  # barh draws bottom-up: keep the JSON order (baselines first) top-down
        labels = [r["arm"] for r in rows]
        vals = [r["GB/s"] for r in rows]
        base = [r["method"] not in STYLE for r in rows]
        colours = [BASELINE_COLOUR if b else STYLE[r["method"]][0] for r, b in zip(rows, base)]
        bars = ax.barh(range(len(rows)), vals, color=colours, hatch=None)
        for bar, b in zip(bars, base):
            if b:
                bar.set_hatch("//")
                bar.set_edgecolor("0.3")
        for i, v in enumerate(vals):
            ax.text(v * 1.06, i, f"{v:.1f}", va="center", fontsize=8)
        ax.set_yticks(range(len(rows)), labels, fontsize=8)
        for tick, b in zip(ax.get_yticklabels(), base):
            if b:
                tick.set_fontstyle("italic")
        _gbps_axis(plt, ax, lo, hi, (0.01, 0.02, 0.05, 0.1, 0.2) + GBPS_TICKS, f"{op}, x {list(shape)} float16")
    from matplotlib.patches import Patch
    fig.legend(handles=[Patch(facecolor=BASELINE_COLOUR, edgecolor="0.3", hatch="//",
                              label="baseline: fp16 copy, mx.quantize / mx.dequantize (g64, b4)"),
                        Patch(facecolor=STYLE["turboquant"][0], label="accelerated.ops (colour = method)")],
               loc="lower center", ncol=2, fontsize=8, frameon=False)
    dev = res["device"]
    kind = f"{dev['name']} ({dev['backend']})" if dev["type"] == "gpu" else f"CPU {dev['name']}"
    st = res["settings"]
    fig.suptitle(f"accelerated.ops throughput — {kind}, {res['date'][:10]}, median of {st['iters']} "
                 f"interleaved iterations (higher is better)", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return _save(fig, plt, path), None


# tools/bench/kernels.py arms, light to dark: accelerated.ops, accelerated.kernels (full API), kernel alone.
KERNEL_ARMS = (("ops", 0.35, "veloxquant.accelerated.ops"),
               ("kernels", 0.7, "accelerated.kernels (full API, incl. validation syncs)"),
               ("kernel only", 1.0, "kernel only (fused launch, no checks)"))


def bench_kernels_plot(res: dict, path: pathlib.Path) -> tuple[pathlib.Path | None, str | None]:
    """GB/s per method of a tools/bench/kernels.py run at its largest T: ops / kernels / kernel only bars
    (colour = method, shade = arm), the fp16 copy and mx.quantize / mx.dequantize baselines as lines."""
    plt = _pyplot()
    if plt is None:
        return None, "matplotlib is not installed"
    from .harness import arm_kind, parse_title

    parsed = [(parse_title(g["title"]), g) for g in res["groups"]]
    parsed = [(t, g) for t, g in parsed if t[2] is not None]
    if not parsed:
        return None, "no group titles with an x shape"
    tokens = max(t[2][2] for t, _ in parsed)
    if tokens <= 1:
        return None, "no groups over more than one token"
    ops_order = list(dict.fromkeys(t[0] for t, _ in parsed if t[2][2] == tokens))
    fig, axes = plt.subplots(1, len(ops_order), figsize=(6.4 * len(ops_order), 6.2), squeeze=False)
    vals_all = [s["GBps"] for t, g in parsed if t[2][2] == tokens for s in g["arms"].values()]
    lo, hi = min(vals_all), max(vals_all)
    width = 0.26
    for ax, op in zip(axes[0], ops_order):
        groups = [(t, g) for t, g in parsed if t[0] == op and t[2][2] == tokens]
        labels = [t[1] for t, _ in groups][::-1]  # barh draws bottom-up: keep the JSON order top-down
        base: dict[str, list[float]] = {}
        for y, ((_, label, _), g) in enumerate(groups[::-1]):
            colour = STYLE.get(label.split()[0], ("0.3", "o"))[0]
            for j, (kind, alpha, _) in enumerate(KERNEL_ARMS):
                arm = f"{kind} {label}"
                if arm not in g["arms"]:
                    continue
                v = g["arms"][arm]["GBps"]
                yy = y + (1 - j) * width   # ops on top, kernel only at the bottom of each method's cluster
                ax.barh(yy, v, height=width * 0.92, color=colour, alpha=alpha, edgecolor=colour)
                ax.text(v * 1.06, yy, f"{v:.1f}", va="center", fontsize=7)
            for arm, s in g["arms"].items():
                if arm_kind(arm, label) == arm:   # a baseline arm, measured again in every group
                    base.setdefault(arm, []).append(s["GBps"])
        for (arm, v), style in zip(base.items(), ("--", ":")):
            med = statistics.median(v)
            ax.axvspan(min(v), max(v), color=BASELINE_COLOUR, alpha=0.12, lw=0)
            ax.axvline(med, color="0.3", linestyle=style, linewidth=1.2,
                       label=f"{arm}: {med:.1f} GB/s (median of {len(v)} groups)")
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylim(-0.6, len(labels) - 0.4)
        _gbps_axis(plt, ax, lo, hi, GBPS_TICKS, f"{op}, x {groups[0][0][2]} float16")
        # Below the axis: inside it would hide bars.
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=7, frameon=False,
                  title="baselines, measured in every group (band: their range)", title_fontsize=7)
    from matplotlib.patches import Patch
    fig.legend(handles=[Patch(facecolor="0.25", alpha=a, label=t) for _, a, t in KERNEL_ARMS],
               loc="lower center", ncol=3, fontsize=8, frameon=False, title="shade = arm (colour = method)",
               title_fontsize=8)
    info = res.get("device_info", {})
    st = res["settings"]
    fig.suptitle(f"accelerated.kernels vs accelerated.ops throughput — {info.get('device_name', res['device'])} "
                 f"({res.get('backend', '?')}), {res['date'][:10]}, median of {st['iters']} interleaved "
                 f"iterations (higher is better)", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return _save(fig, plt, path), None


def bench_sweep_plot(res: dict, path: pathlib.Path) -> tuple[pathlib.Path | None, str | None]:
    """tools/bench/sweep.py: GB/s against N (log-log), one line per method, encode and decode side by side;
    top row x GB/s (fp16 bytes of x per second), bottom row moved GB/s (read + written); the fp16 copy and
    mx.quantize / mx.dequantize in grey."""
    plt = _pyplot()
    if plt is None:
        return None, "matplotlib is not installed"
    from .harness import case_of

    ops = [op for op in ("encode", "decode") if any(g["op"] == op for g in res["groups"])]
    if not ops:
        return None, "no sweep groups"
    fig, axes = plt.subplots(2, len(ops), figsize=(6.6 * len(ops), 9.0), squeeze=False, sharex=True)
    for col, op in enumerate(ops):
        gs = sorted((g for g in res["groups"] if g["op"] == op), key=lambda g: g["n"])
        ns = [g["n"] for g in gs]
        for row, key in enumerate(("x_GBps", "moved_GBps")):
            ax = axes[row][col]
            for arm in gs[0]["arms"]:
                ys = [g["arms"][arm][key] for g in gs]
                case = case_of(arm)
                if case is None:
                    ax.plot(ns, ys, color="0.35", linestyle="--" if "copy" in arm else ":", linewidth=1.6,
                            label=arm)
                else:
                    colour, marker = STYLE.get(case.split()[0], ("0.2", "o"))
                    style = "-." if "keys" in case else "-"
                    ax.plot(ns, ys, color=colour, marker=marker, linestyle=style, linewidth=1.3, markersize=4,
                            label=case)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(ns, [f"{n // 1024}k" for n in ns])
            ax.xaxis.set_minor_formatter(plt.NullFormatter())
            ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(plt.FuncFormatter(
                lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(f"{op}: {'x GB/s (fp16 bytes of x per second)' if row == 0 else 'moved GB/s (read + written)'}",
                         fontsize=10)
            if row == 1:
                ax.set_xlabel("N vectors (d = 128, H = 8, float16)")
        axes[0][col].legend(fontsize=7, ncol=2)
    info = res.get("device_info", {})
    st = res["settings"]
    fig.suptitle(f"fused kernels against the memory — {info.get('device_name', res['device'])} "
                 f"({res.get('backend', '?')}), {res['date'][:10]}, median of {st['iters']} interleaved iterations",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return _save(fig, plt, path), None


def quality_trained_plot(result: dict, path: pathlib.Path) -> tuple[pathlib.Path | None, str | None]:
    """Perplexity (top) and passkey retrieval (bottom) vs measured stored bits per quantized
    coordinate: one line per method, one column per (head dim, context, variant); mlx-lm's
    QuantizedKVCache as black points, the fp16 cache as a dashed line."""
    plt = _pyplot()
    if plt is None:
        return None, "matplotlib is not installed"
    rows = result["results"]
    panels = []
    for blk in result["settings"]["blocks"]:
        for v in blk["variants"]:
            if v in ("kv", "k", "v"):
                panels.append((blk["head_dim"], blk["context"], v))
    if not panels:
        return None, "no kv, k or v rows"
    names = {"kv": "keys and values", "k": "keys only (values fp16)", "v": "values only (keys fp16)"}
    fig, axes = plt.subplots(2, len(panels), figsize=(max(9.0, 4.3 * len(panels)), 7.8), squeeze=False,
                             sharex=True)
    for col, (d, n, v) in enumerate(panels):
        sub = [r for r in rows if r["head_dim"] == d and r["context"] == n]
        top, bot = axes[0][col], axes[1][col]
        base = next((r for r in sub if r["method"] == "fp16"), None)
        for m in dict.fromkeys(r["method"] for r in sub if r["variant"] == v):
            if m.startswith("mlx_q") or m == "fp16":
                continue
            pts = sorted((r["role_bits_per_coord"], r["ppl"], r["retrieval"],
                          f"{r['bits']}+{r['bits2']}" if r["bits2"] else str(r["bits"]))
                         for r in sub if r["method"] == m and r["variant"] == v)
            colour, marker = STYLE.get(m, (None, "o"))
            x, p, q, lab = zip(*pts)
            top.plot(x, p, marker=marker, color=colour, label=m, linewidth=1.3, markersize=5)
            bot.plot(x, [100 * y for y in q], marker=marker, color=colour, linewidth=1.3, markersize=5)
            for xi, pi, li in zip(x, p, lab):
                top.annotate(li, (xi, pi), textcoords="offset points", xytext=(3, 3), fontsize=6, color=colour)
        if v == "kv":  # mlx-lm's caches quantize both roles
            for r in sub:
                if r["method"].startswith("mlx_q"):
                    mk = "X" if r["bits"] == 4 else "*"
                    lab = f"mlx-lm QuantizedKVCache q{r['bits']}"
                    top.plot([r["role_bits_per_coord"]], [r["ppl"]], mk, color="black", markersize=8, label=lab)
                    bot.plot([r["role_bits_per_coord"]], [100 * r["retrieval"]], mk, color="black", markersize=8)
        if base is not None:
            top.axhline(base["ppl"], color="0.3", linestyle="--", linewidth=1, label="fp16 KVCache")
            bot.axhline(100 * base["retrieval"], color="0.3", linestyle="--", linewidth=1)
        top.set_title(f"head dim {d}, context {n}\n{names[v]}", fontsize=9)
        bot.set_ylim(-5, 105)
        bot.set_xlabel("stored bits per quantized coordinate")
        for ax in (top, bot):
            ax.grid(True, which="major", alpha=0.35)
    axes[0][0].set_ylabel("held-out perplexity (per byte)")
    axes[1][0].set_ylabel("passkey exact match, %")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=8, frameon=False)
    fig.suptitle(f"Trained byte-level llama: quality vs bits per coordinate\n{result.get('device', '')}, "
                 f"{result.get('date', '')[:10]}; labels: configured bits", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return _save(fig, plt, path), None
