"""The decode-step benchmark's report: docs/benchmarks.md sections and figures from a `bench-decode` run's JSON
(tools/bench/decode.py measures)."""
from __future__ import annotations

import json
import pathlib
import statistics

from .harness import B, D, HKV, HQ, PIPE
from .plots import _save


def _ctx(r: dict) -> str:
    """A layer row's context, with its batch (`4096 × 8`: 8 sequences of up to 4096 tokens) where it has one."""
    return f"{r['context']} × {r['batch']}" if r.get("batch", 1) > 1 else f"{r['context']}"


def _us(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def render(res: dict, name: str) -> list[str]:
    """One run's docs/benchmarks.md section: its header, then a table per suite it ran."""
    dev = res["device"]
    v = res["versions"]
    lines = [f"## Decode step: {dev['name']} ({dev['type']}), {res['date']}", "",
             f"- Versions: mlx {v.get('mlx')}, mlx-lm {v.get('mlx-lm')}, spec {v.get('spec')}, git {v.get('git')}",
             f"- Command: `{res['command']}`",
             f"- Raw data: `{name}`; attention shape B={B}, {HQ} query heads, {HKV} KV heads, d={D}, float16",
             f"- Copy ceiling measured in the same run: {res['copy_bytes_per_s'] / 1e9:.1f} GB/s "
             "(float16 copy, read + write)", ""]
    return lines + _layer_table(res) + _e2e_table(res.get("e2e") or []) + _batch_table(res)


def _layer_table(res: dict) -> list[str]:
    lines = []
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
                  "(tools/bench/gpu_clock.py: its launches queued behind a spin, timed by the GPU's clock; CUDA only), so "
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
    return lines


def _e2e_table(e2e: list[dict]) -> list[str]:
    lines = []
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
    return lines


def _batch_table(res: dict) -> list[str]:
    lines = []
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
    return _save(fig, plt, path)


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
    return _save(fig, plt, path)


def _plots(res: dict, path: pathlib.Path | None, log) -> None:
    """--plot: the layer suite's plot at `path` and the batch suite's at `path` with -batch before the suffix."""
    if path is None:
        return
    made = [plot(res, path) if res.get("layer") else None,
            plot_batch(res, path.with_name(path.stem + "-batch" + path.suffix)) if res.get("batch") else None]
    for m in made:
        if m is not None:
            log(f"wrote {m}")


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
