"""Figures for docs/: quality (KL vs bits/coord, perplexity and retrieval vs bits), from the JSON; the helpers the
quality figures share (_pyplot, _save, STYLE).

matplotlib is optional (`pip install veloxquant[plots]`): every function returns (path, None) when it wrote
the PNG and (None, reason) when it could not, so the tools still write their JSON and markdown without it.
The Agg backend renders to files only (no display needed on servers).
"""
from __future__ import annotations

import pathlib

# Same colour and marker for a method in every figure.
STYLE = {
    "turboquant": ("tab:blue", "o"), "turboquant_rvq": ("tab:orange", "s"),
    "turboquant_prod": ("tab:green", "^"), "kivi": ("tab:red", "D"), "rabitq": ("tab:purple", "P"),
    "mlx_affine": ("tab:brown", "v"),
}


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
