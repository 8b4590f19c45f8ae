"""docs/benchmarks.md's gated section, rendered from the benchmarks' saved runs (pytest-benchmark JSON written by
`pytest benchmarks ... --benchmark-json benchmarks/baselines/<device>.json`): per run, the command, date, machine and
versions, and one table per suite with the ratios the gate compares.

    python -m veloxquant.tools.bench.render benchmarks/baselines/*.json --write docs/benchmarks.md
    python -m veloxquant.tools.bench.render benchmarks/baselines/*.json --check docs/benchmarks.md

--write replaces the text between the BEGIN / END markers below (adding both at the top of the file's first section
where they are missing); --check exits 1 when that text differs from a fresh rendering.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

BEGIN = "<!-- begin: rendered by tools/bench/render.py from benchmarks/baselines/*.json; do not edit by hand -->"
END = "<!-- end: rendered by tools/bench/render.py -->"


def _t(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} µs"


def _r(b: dict, name: str) -> str:
    r = b["extra_info"].get("ratios", {}).get(name)
    if r is None:
        return "—"
    iqr = b["extra_info"].get("ratio_iqr", {}).get(name)
    return f"**{r:.2f}**" + (f" ({iqr:.2f})" if iqr is not None else "")


def _band(bands: dict, suite: str, name: str = "fp16") -> str:
    b = bands.get(suite)
    b = b.get(name) if isinstance(b, dict) else b
    return "not gated" if b is None else f"gate band +{b:.0%}"


def _median(b: dict) -> float | None:
    return b["extra_info"].get("median_s", b.get("stats", {}).get("median"))


def _base(b: dict, name: str) -> float | None:
    return b["extra_info"].get("baseline_median_s", {}).get(name)


def _by_context(rows: list[dict]) -> tuple[list, dict]:
    """(contexts in order, {arm: {context: benchmark}}), arms in the order they first appear."""
    contexts, arms = [], {}
    for b in rows:
        e = b["extra_info"]
        if e["context"] not in contexts:
            contexts.append(e["context"])
        arms.setdefault(e["arm"], {})[e["context"]] = b
    return sorted(contexts), arms


def _k(t: int) -> str:
    return f"{t // 1024}k" if t % 1024 == 0 else str(t)


def _decode_step(rows: list[dict], bands: dict, ratio_note: str) -> list[str]:
    contexts, arms = _by_context(rows)
    e0 = rows[0]["extra_info"]
    lines = [f"Decode step per layer: append one token + attention through mlx-lm's dispatch, {e0['layers']} layers "
             f"per evaluation (Llama-3-8B attention shape), at each context; cell: ours ÷ fp16 KVCache, "
             f"{ratio_note}, then ours per layer; {_band(bands, 'decode_step')}. Bytes per layer at the largest "
             f"context (÷ the same tokens in fp16).", "",
             "| arm | " + " | ".join(f"{_k(t)}: ours ÷ fp16, ours / layer" for t in contexts) + " | bytes / layer |",
             "|---|" + "---|" * (len(contexts) + 1)]
    fp16 = {t: [_base(b, "fp16") / b["extra_info"]["layers"] for a in arms.values() for c, b in a.items()
                if c == t and _base(b, "fp16")] for t in contexts}
    lines.append("| fp16 KVCache (median over its rounds in every benchmark) | " + " | ".join(
        f"1, {_t(statistics.median(fp16[t]))}" if fp16[t] else "—" for t in contexts) + " | |")
    for arm, at in arms.items():
        cells = [f"{_r(at[t], 'fp16')}, {_t(_median(at[t]) / at[t]['extra_info']['layers'])}" if t in at else "—"
                 for t in contexts]
        e = at[max(at)]["extra_info"]
        size = (f"{e['bytes_per_layer'] / 1e6:.2f} MB ({e['bytes_per_layer'] / e['fp16_bytes_per_layer']:.2f})"
                if e.get("fp16_bytes_per_layer") else "—")
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {size} |")
    return lines + [""]


def _generate(rows: list[dict], bands: dict, ratio_note: str) -> list[str]:
    contexts, arms = _by_context(rows)
    e0 = rows[0]["extra_info"]
    lines = [f"End to end: mlx_lm generate_step, random {e0['layers']}-layer llama (shape `{e0['shape']}`), "
             f"{e0['tokens']} tokens generated per round after a prompt of the context's length (prefill untimed); "
             f"cell: ours ÷ fp16 in time per token, {ratio_note} (its inverse is the ratio of tokens/s), then ours "
             f"tokens/s; {_band(bands, 'generate')}.", "",
             "| arm | " + " | ".join(f"{_k(t)}: ours ÷ fp16 (time), ours tokens/s (× fp16's)" for t in contexts)
             + " |",
             "|---|" + "---|" * len(contexts)]
    fp16 = {t: [b["extra_info"]["fp16_tokens_per_s"] for a in arms.values() for c, b in a.items()
                if c == t and b["extra_info"].get("fp16_tokens_per_s")] for t in contexts}
    lines.append("| fp16 KVCache (median over its rounds in every benchmark) | " + " | ".join(
        f"1, {statistics.median(fp16[t]):.1f}" if fp16[t] else "—" for t in contexts) + " |")
    for arm, at in arms.items():
        lines.append(f"| {arm} | " + " | ".join(_gen_cell(at[t]) if t in at else "—" for t in contexts) + " |")
    return lines + [""]


def _gen_cell(b: dict) -> str:
    """ratio (IQR), ours tokens/s (1 / the ratio: ours ÷ fp16 in tokens/s)."""
    e, r = b["extra_info"], b["extra_info"].get("ratios", {}).get("fp16")
    return f"{_r(b, 'fp16')}, {e.get('tokens_per_s', 0):.1f}" + (f" ({1 / r:.2f}×)" if r else "")


def _batch_cell(b: dict) -> str:
    """ratio (IQR), the batch's generation tokens/s (ours ÷ fp16's, the per-round median)."""
    e = b["extra_info"]
    g = e.get("generation_time_ratio")
    return f"{_r(b, 'fp16')}, {e.get('generation_tokens_per_s', 0):.1f}" + (f" ({1 / g:.2f}×)" if g else "")


def _batch(rows: list[dict], bands: dict, ratio_note: str) -> list[str]:
    configs, arms = [], {}
    for b in rows:
        e = b["extra_info"]
        c = (e["context"], e["batch"])
        configs += [c] if c not in configs else []
        arms.setdefault(e["arm"], {})[c] = b
    e0 = rows[0]["extra_info"]
    lines = [f"Batched generation: mlx_lm.batch_generate, random {e0['layers']}-layer llama (shape `{e0['shape']}`), "
             f"B ragged prompts of t, t - 17, ... tokens (prefilled caches handed in, untimed), {e0['tokens']} tokens "
             f"per sequence; cell: ours ÷ fp16 in time of the whole call (cache merge + generation), {ratio_note}; "
             f"then the batch's generation tokens/s (mlx-lm's BatchStats) and its ratio to fp16's in the same rounds "
             f"(higher is better); {_band(bands, 'batch_generate')}.", "",
             "| arm | " + " | ".join(f"{_k(t)} × {n}: ours ÷ fp16 (time), generation tokens/s (× fp16)"
                                    for t, n in configs) + " |",
             "|---|" + "---|" * len(configs)]
    fp16 = {c: [b["extra_info"]["fp16_generation_tokens_per_s"] for a in arms.values() for k, b in a.items()
                if k == c and b["extra_info"].get("fp16_generation_tokens_per_s")] for c in configs}
    lines.append("| fp16 BatchKVCache (median over its rounds in every benchmark) | " + " | ".join(
        f"1, {statistics.median(fp16[c]):.1f}" if fp16[c] else "—" for c in configs) + " |")
    for arm, at in arms.items():
        lines.append(f"| {arm} | " + " | ".join(_batch_cell(at[c]) if c in at else "—" for c in configs) + " |")
    return lines + [""]


def _cold_start(rows: list[dict], bands: dict, ratio_note: str) -> list[str]:
    e0 = rows[0]["extra_info"]
    lines = [f"Cold start: a fresh process's first request (imports, random {e0['layers']}-layer llama of shape "
             f"`{e0['shape']}`, the cache, a {e0['context']}-token prompt, {e0['tokens']} tokens), the whole "
             f"process timed; phases are the child's own medians (import / model / request); {ratio_note}; "
             f"{_band(bands, 'cold_start')}.", "",
             "| arm | ours | fp16 | ours ÷ fp16 | ours phases | fp16 phases |", "|---|---|---|---|---|---|"]
    for b in rows:
        e = b["extra_info"]
        ph = [" / ".join(_t(p.get(k)) for k in ("import_s", "model_s", "request_s"))
              for p in (e.get("ours_phases_s", {}), e.get("fp16_phases_s", {}))]
        lines.append(f"| {e['arm']} | {_t(_median(b))} | {_t(_base(b, 'fp16'))} | {_r(b, 'fp16')} | {ph[0]} | "
                     f"{ph[1]} |")
    return lines + [""]


def _ops(rows: list[dict], bands: dict, ratio_note: str) -> list[str]:
    e0 = rows[0]["extra_info"]
    lines = [f"Encode / decode of {e0['tokens']} tokens × 8 heads, d = 128, float16: our MLX ops against "
             f"mx.quantize / mx.dequantize (4 bits, groups of 64) and the numpy reference (timed every few "
             f"rounds); {ratio_note}; against mx.quantize {_band(bands, 'ops', 'mx.quantize')}, against the "
             f"reference {_band(bands, 'ops', 'reference')}.", "",
             "| op | method | ours | mx.quantize | ours ÷ mx.quantize | reference | ours ÷ reference |",
             "|---|---|---|---|---|---|---|"]
    for b in rows:
        e = b["extra_info"]
        lines.append(f"| {e['op']} | {e['arm']} | {_t(_median(b))} | {_t(_base(b, 'mx.quantize'))} | "
                     f"{_r(b, 'mx.quantize')} | {_t(_base(b, 'reference'))} | {_r(b, 'reference')} |")
    return lines + [""]


SUITES = {"decode_step": _decode_step, "generate": _generate, "batch_generate": _batch, "cold_start": _cold_start,
          "ops": _ops}


def render(data: dict, name: str) -> list[str]:
    """Markdown lines for one saved run."""
    vq = data.get("veloxquant", {})
    dev = vq.get("device", {})
    v = vq.get("versions", {})
    mi = data.get("machine_info", {})
    rows = data.get("benchmarks", [])
    by = {}
    for b in rows:
        by.setdefault(b["extra_info"].get("suite"), []).append(b)
    lines = [f"### {dev.get('name', mi.get('cpu', {}).get('brand_raw', '?'))} ({dev.get('type', '?')}), "
             f"{data.get('datetime', '?')[:19].replace('T', ' ')} UTC", "",
             f"- Command: `{vq.get('command', '?')}`",
             f"- Machine: {dev.get('name', '?')}, {dev.get('cpu_count', '?')} CPU cores, {mi.get('system', '?')} "
             f"{mi.get('release', '')}, Python {mi.get('python_version', '?')}",
             f"- Versions: mlx {v.get('mlx')}, mlx-lm {v.get('mlx-lm')}, numpy {v.get('numpy')}, spec {v.get('spec')}, "
             f"pytest-benchmark {data.get('version', '?')}, git {v.get('git')}"
             f"{' (dirty)' if data.get('commit_info', {}).get('dirty') else ''}",
             f"- Raw data: `{name}`; timer `{rows[0]['options'].get('timer', '?') if rows else '?'}`",
             *([f"- Warm-up: {vq['warmup']}"] if vq.get("warmup") else []),
             ""]
    if data.get("partial"):
        lines += ["**A partial run (--bench-partial): the benchmarks that had finished when the file was last written "
                  "(a run cut short keeps them).**", ""]
    if vq.get("slow_update_s"):
        lines += [f"**This run had the test-only slowed update ({vq['slow_update_s']} s per update_and_fetch).**", ""]
    ratio_note = "median over rounds of ours ÷ baseline timed in the same round (IQR of those ratios); lower is better"
    for suite, fn in SUITES.items():
        if by.get(suite):
            lines += fn(by[suite], vq.get("bands", {}), ratio_note)
    return lines


def merge(paths: list[pathlib.Path]) -> dict:
    """One saved run of several (e.g. one pytest run per suite or context on a GPU with a time limit): the first
    file's context, every file's benchmarks, and every file's command."""
    runs = [json.loads(p.read_text()) for p in paths]
    out = dict(runs[0])
    out["benchmarks"] = [b for r in runs for b in r.get("benchmarks", [])]
    out["partial"] = any(r.get("partial") for r in runs)
    cmds = [r.get("veloxquant", {}).get("command", "?") for r in runs]
    out["veloxquant"] = dict(out.get("veloxquant", {}), command=" ; ".join(cmds) + f" (merged, {len(runs)} runs)")
    if not out["partial"]:
        out.pop("partial")
    return out


def shown(p: pathlib.Path) -> str:
    """The path as the docs show it: relative to the repository where it lies inside it."""
    root = pathlib.Path(__file__).resolve().parents[2]
    try:
        return p.resolve().relative_to(root).as_posix()
    except ValueError:
        return p.as_posix()


def section(paths: list[pathlib.Path]) -> str:
    lines = [BEGIN, "## Gated benchmarks (pytest-benchmark, `benchmarks/`)", "",
             "Each run below is one `pytest benchmarks` run on one device, saved as the gate's baseline for that "
             "device. Every benchmark times our arm with pytest-benchmark and its baseline arm (mlx-lm's fp16 "
             "KVCache, mx.quantize, the numpy reference) in the same rounds, alternating which goes first; the gate "
             "(`--bench-gate <baseline JSON>`) fails a benchmark whose ratio exceeds the baseline's ratio by more "
             "than its suite's band. Absolute times on the shared CPU are not comparable between runs; read the "
             "ratios.", ""]
    for p in paths:
        lines += render(json.loads(p.read_text()), shown(p))
    lines.append(END)
    return "\n".join(lines)


def splice(doc: str, text: str) -> str:
    """`doc` with the text between the markers replaced by `text` (markers included), or `text` inserted before the
    doc's first `## ` heading where there are no markers."""
    if BEGIN in doc and END in doc:
        a, b = doc.index(BEGIN), doc.index(END) + len(END)
        return doc[:a] + text + doc[b:]
    at = doc.find("\n## ")
    at = len(doc) if at < 0 else at + 1
    return doc[:at] + text + "\n\n" + doc[at:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_render", description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", type=pathlib.Path, help="saved runs (pytest-benchmark JSON of benchmarks/)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", type=pathlib.Path, metavar="MD", help="splice the section into this markdown file")
    g.add_argument("--check", type=pathlib.Path, metavar="MD", help="exit 1 if this file's section is stale")
    g.add_argument("--merge", type=pathlib.Path, metavar="JSON",
                   help="write the given runs merged into one saved run here (e.g. a baseline from several runs)")
    a = ap.parse_args(argv)
    for p in a.json:
        if not p.is_file():
            ap.error(f"json: no such file {str(p)!r}")
    if a.merge:
        a.merge.write_text(json.dumps(merge(a.json), indent=4) + "\n")
        print(f"wrote {a.merge}")
        return 0
    text = section(a.json)
    if a.write:
        a.write.write_text(splice(a.write.read_text(), text))
        print(f"wrote {a.write}")
    elif a.check:
        if splice(a.check.read_text(), text) != a.check.read_text():
            print(f"{a.check}: the gated benchmarks section differs from a rendering of {[str(p) for p in a.json]}; "
                  f"run: python -m veloxquant.tools.bench.render {' '.join(map(str, a.json))} --write {a.check}",
                  file=sys.stderr)
            return 1
        print(f"{a.check}: up to date")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
