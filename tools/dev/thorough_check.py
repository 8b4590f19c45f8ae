"""The thorough profile's differential encode/decode cells (conformance/test_differential.py::test_encode_decode,
one cell per method, bits and input dtype; 10,000 hypothesis examples each) within a time budget, resumable.

Why a tool: on the H200 host the 72 cells take ~9,000 process-seconds (12-30 ms per example under 16 processes:
hypothesis' drawing and the numpy reference, not the GPU), more than one 600 s device command. So:
- cells sharing a method and dtype run in one pytest process (its kernels JIT-compile once per head dim: ~25 head
  dims x encode/decode, ~60 s per process), `--jobs` processes side by side, the groups split until there are
  about `--jobs` of them, each group's cells in the order of `HEADLINE_BITS`;
- every process is stopped at `--deadline` seconds; what finished is in `--out`/summary.json, rewritten every poll
  (a cap on the whole command still leaves it), with each cell's status: passed, failed, cut (running at the
  deadline) or not-started;
- `--done SUMMARY.json ...` skips the cells those runs passed, so the next session runs only the rest;
- `--from-logs DIR` builds the summary from the logs of an earlier run instead (the same parser).

Usage (H200): PYTHONUNBUFFERED=1 python3 -m veloxquant.tools.dev.thorough_check --out $OUT/thorough --deadline 520
              [--done docs/conformance/h200-thorough-differential-2026-12-01.json] [--jobs 16] [--methods m ...]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

from ... import spec
from .._env import command_line, utc_now_iso

TEST = "conformance/test_differential.py::test_encode_decode"
DTYPES = ("float16", "bfloat16", "float32")
# bits run first within a method's group: the widths caches use most (4 bits) before the rest
HEADLINE_BITS = (4, 2, 3, 8, 1, 5, 6, 7)
SCHEMA = "veloxquant-thorough-differential/1"
PROG = "veloxquant.tools.dev.thorough_check"
ROOT = pathlib.Path(__file__).resolve().parents[2]     # the folder holding conformance/ (source tree or installed)

_CELL = re.compile(r"test_encode_decode\[([A-Za-z0-9_.-]+)\]")
_RESULT = re.compile(r"test_encode_decode\[([A-Za-z0-9_.-]+)\] (PASSED|FAILED|ERROR|SKIPPED)")
_FINAL = ("passed", "failed", "skipped")
_STATS_HEAD = re.compile(r"^(?:veloxquant/)?conformance/test_differential\.py::test_encode_decode\[([A-Za-z0-9_.-]+)\]:\s*$")
_STATS_RUN = re.compile(r"- (\d+) passing(?: examples)?, (\d+) failing(?: examples)?,? (?:and )?(\d+) invalid")
_DURATION = re.compile(r"^([\d.]+)s call\s+(?:veloxquant/)?conformance/test_differential\.py::test_encode_decode\[([A-Za-z0-9_.-]+)\]")
_COLLECTED = re.compile(r"test_encode_decode\[([A-Za-z0-9_.-]+)\]\s*$")


def all_cells(methods=None) -> list[str]:
    """Every cell id ("<method>-b<bits>-<dtype>") the suite parametrizes, as pytest collects them."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", TEST.split("::")[0],
                        "-k", "test_encode_decode"], capture_output=True, text=True, cwd=ROOT)
    cells = [m.group(1) for ln in r.stdout.splitlines() if (m := _COLLECTED.search(ln))]
    if not cells:
        raise RuntimeError(f"thorough_check: pytest collected no cells:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return [c for c in cells if methods is None or split_cell(c)[0] in methods]


def split_cell(cell: str) -> tuple[str, int, str]:
    """"kivi-b4-float16" -> ("kivi", 4, "float16")."""
    method, b, dtype = cell.rsplit("-", 2)
    if not b.startswith("b") or method not in spec.METHODS or dtype not in DTYPES:
        raise ValueError(f"split_cell: not a cell id: {cell!r}")
    return method, int(b[1:]), dtype


def plan(cells: list[str], jobs: int) -> list[tuple[str, list[str]]]:
    """Groups (name, cells) of one method and dtype each, headline bits first, the largest split in halves until
    there are at least `jobs` groups or every group is one cell."""
    groups: dict[tuple[str, str], list[str]] = {}
    for c in cells:
        m, _, dt = split_cell(c)
        groups.setdefault((m, dt), []).append(c)
    out = [(f"{m}-{dt}", sorted(cs, key=lambda c: HEADLINE_BITS.index(split_cell(c)[1])))
           for (m, dt), cs in groups.items()]
    while out and len(out) < jobs:
        i = max(range(len(out)), key=lambda k: len(out[k][1]))
        name, cs = out[i]
        if len(cs) < 2:
            break
        h = (len(cs) + 1) // 2
        out[i:i + 1] = [(f"{name}-a", cs[:h]), (f"{name}-b", cs[h:])]
    # the longest groups start first
    return sorted(out, key=lambda g: -len(g[1]))


def parse_log(text: str) -> dict[str, dict]:
    """Per cell of one pytest -v log: status, and where the run ended normally, examples and seconds."""
    cells: dict[str, dict] = {}
    for m in _RESULT.finditer(text):
        cells[m.group(1)] = {"status": {"PASSED": "passed", "SKIPPED": "skipped"}.get(m.group(2), "failed")}
    current = None
    for ln in text.splitlines():
        h = _STATS_HEAD.match(ln.strip())
        if h:
            current = h.group(1)
            continue
        r = _STATS_RUN.search(ln)
        if r and current is not None:
            e = cells.setdefault(current, {"status": "unknown"})
            e["examples"] = e.get("examples", 0) + int(r.group(1)) + int(r.group(2))
            e["invalid"] = e.get("invalid", 0) + int(r.group(3))
        d = _DURATION.match(ln.strip())
        if d:
            cells.setdefault(d.group(2), {"status": "unknown"})["seconds"] = float(d.group(1))
    return cells


def _parsed(logs: pathlib.Path, names) -> dict[str, dict]:
    """parse_log of each named group's log that exists."""
    return {n: parse_log(p.read_text(errors="replace")) for n in names if (p := logs / f"{n}.log").exists()}


def summarize(groups, parsed: dict, started: dict, seen_at: dict, meta: dict, alive=frozenset()) -> dict:
    """The summary of a run from its logs: every planned cell's status. A group's cells run in order, so in a
    started group the first cell without a result is running (its process is in `alive`) or cut (stopped at the
    deadline, or its process ended early), and the ones after it have not started."""
    cells = {}
    for name, cs in groups:
        got = parsed.get(name, {})
        first = name in started
        for c in cs:
            e = dict(got.get(c, {}))
            if e.get("status") not in _FINAL:
                e["status"] = ("running" if name in alive else "cut") if first else "not-started"
                first = False
            if c in seen_at and "seconds" not in e:
                e["finished_after_s"] = round(seen_at[c] - started[name], 1)
            e["group"] = name
            cells[c] = e
    return {**meta, "counts": _counts(cells), "cells": cells}


def _counts(cells: dict) -> dict[str, int]:
    """How many cells have each status."""
    out: dict[str, int] = {}
    for e in cells.values():
        out[e["status"]] = out.get(e["status"], 0) + 1
    return out


def _git() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=ROOT).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def done_cells(paths) -> set[str]:
    out = set()
    for p in paths or []:
        d = json.loads(pathlib.Path(p).read_text())
        out |= {c for c, e in d.get("cells", {}).items() if e.get("status") == "passed"}
    return out


def run(args) -> dict:
    out = args.out
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    skip = done_cells(args.done)
    cells = [c for c in all_cells(args.methods) if c not in skip]
    groups = plan(cells, args.jobs)
    meta = {"schema": SCHEMA, "command": command_line(PROG), "date": utc_now_iso(),
            "git": _git(), "impl": args.impl, "device": args.device, "profile": "thorough",
            "max_examples_per_cell": args.max_examples or 10_000, "jobs": args.jobs, "deadline_s": args.deadline,
            "skipped_as_done": sorted(skip)}
    print(f"thorough_check: {len(cells)} cells in {len(groups)} processes ({len(skip)} done before), "
          f"deadline {args.deadline:.0f} s", flush=True)
    env = {**os.environ, "VELOXQUANT_PROFILE": "thorough", "PYTHONUNBUFFERED": "1"}
    if args.max_examples:
        env["VELOXQUANT_MAX_EXAMPLES"] = str(args.max_examples)
    t0 = time.time()
    procs, started, seen_at, pending, files = {}, {}, {}, list(groups), []

    def launch():
        while pending and len([p for p in procs.values() if p.poll() is None]) < args.jobs:
            name, cs = pending.pop(0)
            cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *[f"{TEST}[{c}]" for c in cs],
                   "--impl", args.impl, "--hypothesis-show-statistics", "--durations=0"]
            if args.device:
                cmd += ["--device", args.device]
            f = open(logs / f"{name}.log", "w")
            files.append(f)
            procs[name] = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            started[name] = time.time()

    last = None
    while True:
        launch()
        running = [n for n, p in procs.items() if p.poll() is None]
        parsed = _parsed(logs, procs)         # every log read once per poll
        for got in parsed.values():
            for c, e in got.items():
                if e["status"] in _FINAL and c not in seen_at:
                    seen_at[c] = time.time()
        s = summarize(groups, parsed, started, seen_at, {**meta, "wall_s": round(time.time() - t0, 1)}, set(running))
        line = ", ".join(f"{k} {v}" for k, v in sorted(s["counts"].items()))
        if line != last:
            print(f"[{time.time() - t0:6.0f} s] {line}", flush=True)
            last = line
        (out / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
        if not running and not pending:
            break
        if time.time() - t0 > args.deadline:
            for p in procs.values():
                if p.poll() is None:
                    p.terminate()
            for p in procs.values():
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
            pending.clear()
            break
        time.sleep(args.poll)
    for f in files:
        f.close()
    s = summarize(groups, _parsed(logs, procs), started, seen_at, {**meta, "wall_s": round(time.time() - t0, 1)})
    (out / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    print(f"thorough_check: {s['counts']} in {s['wall_s']} s -> {out / 'summary.json'}", flush=True)
    return s


def from_logs(args) -> dict:
    """A summary of an earlier run's logs (pytest -v, --hypothesis-show-statistics): the cells they name."""
    cells = {}
    for d in args.from_logs:
        for path in sorted(pathlib.Path(d).glob("*.log")):
            text = path.read_text(errors="replace")
            for c, e in parse_log(text).items():
                e["group"] = path.stem
                if cells.get(c, {}).get("status") != "passed":
                    cells[c] = e
            for c in _CELL.findall(text):   # named but unreported: cut
                cells.setdefault(c, {"status": "cut", "group": path.stem})
    return {"schema": SCHEMA, "command": command_line(PROG),
            "profile": "thorough", "counts": _counts(cells), "cells": cells}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--impl", default="mlx_kernels")
    ap.add_argument("--device", default="gpu", help="--device of the suite ('' for MLX's default)")
    ap.add_argument("--methods", nargs="+", choices=spec.METHODS, default=None)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--deadline", type=float, default=520.0, help="seconds until every process is stopped")
    ap.add_argument("--max-examples", type=int, default=0, help="cap per cell (0: the profile's 10,000)")
    ap.add_argument("--done", nargs="*", default=[], help="summaries whose passed cells are skipped")
    ap.add_argument("--from-logs", nargs="+", default=None, metavar="DIR")
    ap.add_argument("--poll", type=float, default=2.0)
    a = ap.parse_args(argv)
    a.device = a.device or None
    if a.from_logs:
        s = from_logs(a)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(s, indent=1) + "\n")
        print(f"thorough_check: {s['counts']} -> {a.out}")
        return 0
    s = run(a)
    return 1 if s["counts"].get("failed") or s["counts"].get("skipped") else 0


if __name__ == "__main__":
    sys.exit(main())
