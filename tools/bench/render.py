"""docs/benchmarks.md, the whole page, rendered from the benchmarks' saved runs (pytest-benchmark JSON written by
`pytest benchmarks ... --benchmark-json`): the gate's baselines (benchmarks/baselines/<device>.json) and the latest kept
run of other benchmarks (the pytest-benchmark runs in docs/bench/); per run, the command, date, machine and versions,
and one table per suite with the ratios the gate compares.

    python -m veloxquant.tools.bench.render --write docs/benchmarks.md      # the default runs (RUNS)
    python -m veloxquant.tools.bench.render --check docs/benchmarks.md
    python -m veloxquant.tools.bench.render A.json B.json --merge run.json  # one saved run of several parts

--write writes the page; --check exits 1 when the file differs from a fresh rendering. Dated results of earlier tools
are in docs/benchmark-log.md, not here.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BEGIN = ("<!-- rendered by tools/bench/render.py from benchmarks/baselines/*.json and docs/bench/'s saved runs; do not "
         "edit by hand: python -m veloxquant.tools.bench.render --write docs/benchmarks.md -->")
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
    return f"**{r:.2f}**" + (f" ({iqr:.2f})" if iqr is not None else "") + (" †" if _slowed(b) else "")


def _slowed(b: dict) -> bool:
    """More than a quarter of the benchmark's timed rounds ran on a slowed host (benchmarks/harness.py round_probe)."""
    e = b["extra_info"]
    return e.get("slow_host_rounds", 0) * 4 > e.get("rounds", 0)


def _slowed_lines(rows: list[dict]) -> list[str]:
    """Under a run's tables: each † cell's median ratio over its rounds on a host at full speed."""
    marked = [b for b in rows if _slowed(b)]
    if not marked:
        return []
    cells = []
    for b in marked:
        e = b["extra_info"]
        what = " ".join(_k(v) if k == "context" else str(v) for k, v in e.items()
                        if k in ("suite", "arm", "method", "op", "context", "batch"))
        steady = ", ".join(f"{r:.2f} (÷ {n})" for n, r in e.get("ratios_steady", {}).items()) or "too few rounds"
        cells.append(f"{what}: {steady}, {e['slow_host_rounds']} of {e['rounds']} rounds slowed")
    f = marked[0]["extra_info"].get("slow_host_factor", "?")
    return [f"† More than a quarter of the cell's rounds ran on a slowed host (its probe, `sum(range(1000))` before each "
            f"round, over {f}x the process's fastest); the median ratio over its other rounds: " + "; ".join(cells)
            + ".", ""]


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


def _gb(b: dict, field: str, name: str) -> str:
    v = b["extra_info"].get(field, {}).get(name)
    return "—" if v is None else f"{v:.0f}"


def _kernels(rows: list[dict], bands: dict, ratio_note: str) -> list[str]:
    lines = [f"Fused kernels against the memory: encode / decode of N vectors (8 heads, d = 128, float16, window 0), the "
             f"kernel launch alone against an fp16 copy of x and mx.quantize / mx.dequantize (4 bits, groups of 64); "
             f"{ratio_note}; GB/s of x (fp16 bytes of x per second) and moved (bytes read + written); "
             f"{_band(bands, 'kernels')}.", "",
             "| op | N | method | ours | ours ÷ fp16 copy | ours ÷ mx.quantize | x GB/s ours / copy / mx | "
             "moved GB/s ours / copy / mx |", "|---|---|---|---|---|---|---|---|"]
    for b in rows:
        e = b["extra_info"]
        names = ("ours", "fp16 copy", "mx.quantize")
        lines.append(f"| {e['op']} | {e['vectors']} | {e['arm']} | {_t(_median(b))} | {_r(b, 'fp16 copy')} | "
                     f"{_r(b, 'mx.quantize')} | {' / '.join(_gb(b, 'x_GBps', n) for n in names)} | "
                     f"{' / '.join(_gb(b, 'moved_GBps', n) for n in names)} |")
    return lines + [""]


SUITES = {"decode_step": _decode_step, "generate": _generate, "batch_generate": _batch, "cold_start": _cold_start,
          "ops": _ops, "kernels": _kernels}


def _host_line(probe: dict | None) -> list[str]:
    """The run's host probe (benchmarks/harness.py host_probe), at its start and end where both were taken."""
    if not probe or "start" not in probe:
        return []
    ends = [probe["start"]] + ([probe["end"]] if "end" in probe else [])
    build = " → ".join(f"{p['mlx_op_build_us']:.2f}" for p in ends)
    py = " → ".join(f"{p['python_sum1000_us']:.1f}" for p in ends)
    return [f"- Host probe ({'start → end' if len(ends) > 1 else 'start'}): MLX op build {build} µs, Python "
            f"`sum(range(1000))` {py} µs: what paces host-bound ratios (generate at 32k, batches); compare machines "
            "by it"]


def notes(folder: pathlib.Path) -> dict:
    """`notes.json` beside saved runs (docs/bench/, benchmarks/baselines/): a run's file name -> a note the page prints
    under its header, for what the run cannot say of itself (a slower host, a default edited on the device); written
    by hand, so the runs stay as the harness wrote them."""
    path = folder / "notes.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def render(data: dict, name: str, note: str | None = None) -> list[str]:
    """Markdown lines for one saved run (`note`: its line from notes.json)."""
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
             f"- Machine: {dev.get('name', '?')}, "
             f"{dev['cpu'] + ' host, ' if dev.get('cpu') and dev.get('cpu') != dev.get('name') else ''}"
             f"{dev.get('cpu_count', '?')} CPU cores, {mi.get('system', '?')} "
             f"{mi.get('release', '')}, Python {mi.get('python_version', '?')}",
             f"- Versions: mlx {v.get('mlx')}, mlx-lm {v.get('mlx-lm')}, numpy {v.get('numpy')}, spec {v.get('spec')}, "
             f"pytest-benchmark {data.get('version', '?')}, git {v.get('git')}"
             f"{' (dirty)' if data.get('commit_info', {}).get('dirty') else ''}",
             f"- Raw data: `{name}`; timer `{rows[0]['options'].get('timer', '?') if rows else '?'}`",
             *([f"- Warm-up: {vq['warmup']}"] if vq.get("warmup") else []),
             *_host_line(vq.get("host_probe")),
             *([f"- Note: {note}"] if note else []),
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
    return lines + _slowed_lines(rows)


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
    try:
        return p.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return p.as_posix()


def is_saved_run(p: pathlib.Path) -> bool:
    """A pytest-benchmark JSON of these benchmarks (not another tool's raw data)."""
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "benchmarks" in data and "veloxquant" in data


def default_runs(root: pathlib.Path | None = None) -> list[pathlib.Path]:
    """RUNS: benchmarks/baselines/*.json, then docs/bench/'s saved runs of these benchmarks (oldest first)."""
    root = ROOT if root is None else root
    kept = [p for p in sorted((root / "docs" / "bench").glob("*.json")) if is_saved_run(p)]
    kept.sort(key=lambda p: json.loads(p.read_text()).get("datetime", ""))
    return sorted((root / "benchmarks" / "baselines").glob("*.json")) + kept


INTRO = """\
Every number on this page comes from one harness, `benchmarks/` (pytest-benchmark), saved as a JSON and rendered here
by tools/bench/render.py; none is typed by hand. Every benchmark times our arm with pytest-benchmark and its
baseline arm (mlx-lm's fp16 KVCache, mx.quantize, the numpy reference) in the same rounds, alternating which goes
first, on a rotating pool of 10 inputs; a cell is the median over rounds of ours ÷ baseline (lower is better), with
the IQR of those per-round ratios. Compare arms within a run; absolute times on the shared CPU are not comparable
between runs. Dated results of the tools the harness replaced: [benchmark-log.md](benchmark-log.md).

## Running

- One command: `veloxquant bench` (the CPU; `--device gpu` on a GPU) runs `pytest benchmarks` with the device's
  sizes, writes the run's JSON (`--json`, default `.benchmarks/<device>-<UTC time>.json`, ignored by git) and renders it
  (`--markdown`); `--gate` fails on a ratio that regressed against benchmarks/baselines/<device>.json (cpu.json; on a
  GPU its kind's where one is saved, h100.json or h200.json, else h200.json) beyond the suite's noise band; anything
  after `--` goes to pytest (`-k`, `--bench-contexts`, `--bench-arms`, ...).
- The same with pytest: `pytest benchmarks --device cpu --bench-gate benchmarks/baselines/cpu.json` (CI's quick gate;
  38 s on the quiet 2-core machine), `pytest benchmarks --device gpu --bench-gate benchmarks/baselines/h200.json`
  (skipped, with the reason, where MLX has no GPU).
- A new baseline: the same without the gate, `--benchmark-json benchmarks/baselines/<device>.json`, then
  `python -m veloxquant.tools.bench.render --write docs/benchmarks.md` (tests/test_bench_gate.py checks this page
  against the saved runs). Another run worth keeping (a `--bench-kv` run of the recommended configurations, say)
  goes to docs/bench/ and is rendered below the baselines; the one it replaces is deleted.
- Sizes per device, bands and warm-up: benchmarks/harness.py (`SIZES`, `BANDS`; how the bands were chosen is in its
  comment and in benchmark-log.md). The gate is one-sided: a ratio that improves never fails; a benchmark the
  baseline lacks is not gated until the next save. Arms of one process only: an A/B of a tuning knob is an arm such
  as `--bench-arms "turboquant b4" "turboquant b4 [FUSE_COMBINE=1]"` (accelerated/tuning.py), never two runs.
"""


def page(paths: list[pathlib.Path]) -> str:
    """The whole docs/benchmarks.md: INTRO, the baselines, then the other kept runs."""
    lines = [BEGIN, "# Benchmarks", "", INTRO.rstrip("\n"), ""]
    base = [p for p in paths if p.parent.name == "baselines"]
    other = [p for p in paths if p not in base]
    for title, group, note in (
            ("The gate's baselines (benchmarks/baselines/)", base,
             "One run per device, the gate's baseline for that device."),
            ("Other kept runs (docs/bench/)", other,
             "The latest run of each other benchmark worth keeping, newest last.")):
        if group:
            lines += [f"## {title}", "", note, ""]
            kept = {f: notes(f) for f in {p.parent for p in group}}      # (one read of each folder's notes)
            for p in group:
                lines += render(json.loads(p.read_text()), shown(p), kept[p.parent].get(p.name))
    lines.append(END)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_render", description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="*", type=pathlib.Path,
                    help="saved runs (pytest-benchmark JSON of benchmarks/); default: benchmarks/baselines/*.json and "
                         "docs/bench/'s saved runs")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", type=pathlib.Path, metavar="MD", help="write the page to this markdown file")
    g.add_argument("--check", type=pathlib.Path, metavar="MD", help="exit 1 if this file differs from the rendering")
    g.add_argument("--merge", type=pathlib.Path, metavar="JSON",
                   help="write the given runs merged into one saved run here (e.g. a baseline from several runs)")
    a = ap.parse_args(argv)
    if a.merge and not a.json:
        ap.error("--merge: give the runs to merge")
    paths = a.json or default_runs()
    for p in paths:
        if not p.is_file():
            ap.error(f"json: no such file {str(p)!r}")
    if a.merge:
        a.merge.write_text(json.dumps(merge(paths), indent=4) + "\n")
        print(f"wrote {a.merge}")
        return 0
    text = page(paths)
    if a.write:
        a.write.write_text(text)
        print(f"wrote {a.write}")
    elif a.check:
        if not a.check.is_file() or a.check.read_text() != text:
            args = " ".join(map(str, a.json))
            print(f"{a.check}: differs from a rendering of {[shown(p) for p in paths]}; run: python -m "
                  f"veloxquant.tools.bench.render {args + ' ' if args else ''}--write {a.check}", file=sys.stderr)
            return 1
        print(f"{a.check}: up to date")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
