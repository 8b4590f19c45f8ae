"""The figure of docs/quality-retrieval.md: KL(fp16 ‖ cache) against stored bits per coordinate, keys alone (the
plain model and the `outliers` variant) and values alone, one colour per method, from the page's merged cells."""
from __future__ import annotations

import pathlib

from ..bench.plots import NO_MATPLOTLIB, _pyplot, _save

CONTEXT = 1024      # the recommendation's context: every configuration has its k / v cells there


def caption(context: int = CONTEXT) -> str:
    return (f"KL(fp16 ‖ cache), mean over text positions at {context} bytes, against stored bits per coordinate: "
            "keys alone (left; filled: the plain model, open: the `outliers` variant) and values alone (right); "
            "one colour per method, from the cells of the tables below.")


def plot(rows: list[dict], path: pathlib.Path, context: int = CONTEXT) -> tuple[pathlib.Path | None, str | None]:
    """The figure at `path` (a palette PNG), or (None, why not)."""
    plt = _pyplot()
    if plt is None:
        return None, NO_MATPLOTLIB
    cells = [r for r in rows if r["context"] == context and r.get("variant") in ("k", "v")
             and r.get("kl_mean") is not None and r.get("method")]
    if not cells:
        return None, f"no keys-only or values-only cells at {context} bytes"
    methods = list(dict.fromkeys(r["method"] for r in cells))
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.4), sharey=True)
    for ax, role, title in ((axes[0], "k", "keys alone"), (axes[1], "v", "values alone")):
        for model, face in (("plain", "full"), ("outliers", "none")):
            for m in methods:
                pts = sorted((r["role_bits_per_coord"], r["kl_mean"]) for r in cells
                             if r["variant"] == role and r["model"] == model and r["method"] == m)
                if not pts:
                    continue
                c = colours[m]
                ax.plot(*zip(*pts), marker="o", linestyle="-" if face == "full" else ":", color=c,
                        markerfacecolor=c if face == "full" else "none",
                        label=m if (model == "plain" and role == "k") else None)
        ax.set_yscale("log")
        ax.set_xlabel("stored bits per coordinate")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(f"KL mean at {context} bytes (nats)")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return _save(fig, plt, path), None
