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


def render(data: dict, name: str) -> list[str]:
    """Markdown lines for one saved run."""
    vq = data.get("veloxquant", {})
    dev = vq.get("device", {})
    v = vq.get("versions", {})
    mi = data.get("machine_info", {})
    bands = vq.get("bands", {})
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
             ""]
    if vq.get("slow_update_s"):
        lines += [f"**This run had the test-only slowed update ({vq['slow_update_s']} s per update_and_fetch).**", ""]
    ratio_note = "median over rounds of ours ÷ baseline timed in the same round (IQR of those ratios); lower is better"
    if by.get("decode_step"):
        b0 = by["decode_step"][0]["extra_info"]
        lines += [f"Decode step per layer: append one token + attention through mlx-lm's dispatch, "
                  f"{b0['layers']} layers per evaluation, context {b0['context']} (Llama-3-8B attention shape); "
                  f"ratio: {ratio_note}; {_band(bands, 'decode_step')}.", "",
                  "| arm | ours / layer | fp16 KVCache / layer | ours ÷ fp16 | bytes / layer (÷ fp16) |",
                  "|---|---|---|---|---|"]
        for b in by["decode_step"]:
            e = b["extra_info"]
            lines.append(f"| {e['arm']} | {_t(_median(b) / e['layers'])} | {_t(_base(b, 'fp16') / e['layers'])} | "
                         f"{_r(b, 'fp16')} | {e['bytes_per_layer'] / 1e6:.2f} MB "
                         f"({e['bytes_per_layer'] / e['fp16_bytes_per_layer']:.2f}) |")
        lines.append("")
    if by.get("generate"):
        e0 = by["generate"][0]["extra_info"]
        lines += [f"End to end: mlx_lm generate_step, random {e0['layers']}-layer llama (shape `{e0['shape']}`), "
                  f"{e0['tokens']} tokens generated after a {e0['context']}-token prompt (prefill untimed); ratio of "
                  f"times per token: {ratio_note}; {_band(bands, 'generate')}.", "",
                  "| arm | ours tokens/s | fp16 tokens/s | ours ÷ fp16 (time) |", "|---|---|---|---|"]
        for b in by["generate"]:
            e = b["extra_info"]
            lines.append(f"| {e['arm']} | {e.get('tokens_per_s', 0):.1f} | {e.get('fp16_tokens_per_s', 0):.1f} | "
                         f"{_r(b, 'fp16')} |")
        lines.append("")
    if by.get("cold_start"):
        e0 = by["cold_start"][0]["extra_info"]
        lines += [f"Cold start: a fresh process's first request (imports, random {e0['layers']}-layer llama of shape "
                  f"`{e0['shape']}`, the cache, a {e0['context']}-token prompt, {e0['tokens']} tokens), the whole "
                  f"process timed; phases are the child's own medians (import / model / request); {ratio_note}; "
                  f"{_band(bands, 'cold_start')}.", "",
                  "| arm | ours | fp16 | ours ÷ fp16 | ours phases | fp16 phases |", "|---|---|---|---|---|---|"]
        for b in by["cold_start"]:
            e = b["extra_info"]
            ph = [" / ".join(_t(p.get(k)) for k in ("import_s", "model_s", "request_s"))
                  for p in (e.get("ours_phases_s", {}), e.get("fp16_phases_s", {}))]
            lines.append(f"| {e['arm']} | {_t(_median(b))} | {_t(_base(b, 'fp16'))} | {_r(b, 'fp16')} | {ph[0]} | "
                         f"{ph[1]} |")
        lines.append("")
    if by.get("ops"):
        e0 = by["ops"][0]["extra_info"]
        lines += [f"Encode / decode of {e0['tokens']} tokens × 8 heads, d = 128, float16: our MLX ops against "
                  f"mx.quantize / mx.dequantize (4 bits, groups of 64) and the numpy reference (timed every few "
                  f"rounds); {ratio_note}; against mx.quantize {_band(bands, 'ops', 'mx.quantize')}, against the "
                  f"reference {_band(bands, 'ops', 'reference')}.", "",
                  "| op | method | ours | mx.quantize | ours ÷ mx.quantize | reference | ours ÷ reference |",
                  "|---|---|---|---|---|---|---|"]
        for b in by["ops"]:
            e = b["extra_info"]
            lines.append(f"| {e['op']} | {e['arm']} | {_t(_median(b))} | {_t(_base(b, 'mx.quantize'))} | "
                         f"{_r(b, 'mx.quantize')} | {_t(_base(b, 'reference'))} | {_r(b, 'reference')} |")
        lines.append("")
    return lines


def _shown(p: pathlib.Path) -> str:
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
        lines += render(json.loads(p.read_text()), _shown(p))
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
    a = ap.parse_args(argv)
    for p in a.json:
        if not p.is_file():
            ap.error(f"json: no such file {str(p)!r}")
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
