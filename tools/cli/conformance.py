"""`veloxquant conformance`: run the conformance suite (pytest underneath) and report.

Prints progress, then a table (method x bits x dtype: tests, cases, bit-exact, first failure) and writes
a JSON report (schema in conformance/README.md). The table has rows for the selected methods only (plus the
method-independent rows); every skipped test is listed under the table with its reason, grouped. Exit status: pytest's, except that an unexpected pass of an
xfail entry (XPASS) fails the run (1): the list is out of date. A usage error (unknown --impl or method, an
implementation or device that cannot run here) prints one line and exits 4, with no table.
"""
from __future__ import annotations

import datetime
import json
import pathlib
import sys
import time

from ... import spec

SUITE = pathlib.Path(__file__).resolve().parents[2] / "conformance"
SCHEMA = "veloxquant-conformance-report/1"
TOLERANCE_FILES = ("test_attention.py",)   # tolerance tier; everything else is the bit-exact tier


def add_arguments(p) -> None:
    p.add_argument("--impl", default="mlx_ops",
                   help="reference | mlx_ops | mlx_kernels | mlx_native | package.module:factory (default mlx_ops)")
    p.add_argument("--device", choices=["cpu", "gpu"], default=None,
                   help="MLX device (default: mlx's default); a device that is not there is an error")
    p.add_argument("--methods", default=None, help=f"comma list out of {','.join(spec.METHODS)} (default: all)")
    p.add_argument("--profile", choices=["ci", "thorough"], default="ci", help="hypothesis profile")
    p.add_argument("--json", metavar="PATH", default=None, help="write the JSON report here")
    p.add_argument("--rules-report", metavar="PATH", default=None,
                   help="write per spec rule (spec/rules.toml) passed / failed / not exercised as JSON to PATH")
    p.add_argument("-k", dest="keyword", default=None, help="pytest -k expression (select tests)")
    p.add_argument("--verbose-failures", action="store_true", help="print every failure message in full")


class _Collector:
    """pytest plugin: per-test outcome, tags (user_properties) and messages; progress on stdout."""

    def __init__(self, out=None):
        self.tests: dict[str, dict] = {}
        self.total = 0
        self.done = 0
        self.out = sys.stdout if out is None else out   # this run's stdout, not the one at import time
        self.t0 = time.monotonic()
        self.config = None
        self._last = 0.0

    def pytest_configure(self, config):
        self.config = config

    def pytest_collection_finish(self, session):
        self.total = len(session.items)
        print(f"collected {self.total} tests", file=self.out, flush=True)

    def pytest_runtest_logreport(self, report):
        t = self.tests.setdefault(report.nodeid, {"id": report.nodeid, "outcome": "passed", "message": None,
                                                  "duration_s": 0.0})
        t["duration_s"] += report.duration
        props = dict(report.user_properties)
        for k in ("method", "bits", "dtype", "cases"):
            if k in props:
                t[k] = props[k]
        if report.when == "call" or report.outcome != "passed":
            if hasattr(report, "wasxfail"):
                t["outcome"] = "xfailed" if report.skipped else "xpassed"
                t["message"] = report.wasxfail
            elif report.skipped:
                t["outcome"] = "skipped"
                lr = report.longrepr
                t["message"] = lr[2] if isinstance(lr, tuple) else str(lr)
            elif report.failed:
                t["outcome"] = "failed" if report.when == "call" else "error"
                crash = getattr(report.longrepr, "reprcrash", None)
                t["message"] = (crash.message if crash else str(report.longrepr))[:4000]
        if report.when == "teardown":
            self.done += 1
            now = time.monotonic()
            if now - self._last > 2.0 or self.done == self.total:
                self._last = now
                counts = _counts(self.tests.values())
                print(f"  [{self.done}/{self.total}] {now - self.t0:6.1f}s  " +
                      "  ".join(f"{k} {v}" for k, v in counts.items() if v), file=self.out, flush=True)


def _counts(tests) -> dict:
    out = {k: 0 for k in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")}
    for t in tests:
        out[t["outcome"]] += 1
    return out


def _skip_reason(message: str | None) -> str:
    """A skip's reason as the report shows it: pytest's "Skipped: " prefix dropped, its empty-parametrization
    wording said in the suite's terms."""
    m = (message or "").strip()
    m = m[len("Skipped: "):] if m.startswith("Skipped: ") else m
    if m.startswith("got empty parameter set"):
        return f"no selected method applies (pytest: {m})"
    return m or "(no reason given)"


def _in_selection(t: dict, methods) -> bool:
    """False for a test of a method that was not selected (it skips; the table leaves its row out)."""
    m = t.get("method")
    return methods is None or m is None or str(m) not in spec.METHODS or str(m) in methods


def _cells(tests, methods=None) -> list[dict]:
    """Table rows per (method, bits, dtype); with `methods`, tests of other methods are left out."""
    cells: dict[tuple, dict] = {}
    for t in tests:
        if not _in_selection(t, methods):
            continue
        key = (str(t.get("method", "-")), str(t.get("bits", "any")), str(t.get("dtype", "any")))
        c = cells.setdefault(key, {"method": key[0], "bits": key[1], "dtype": key[2], "tests": 0, "cases": 0,
                                   "bit_exact": 0, "tolerance_ok": 0, "failed": 0, "skipped": 0,
                                   "xfailed": 0, "first_failure": None})
        c["tests"] += 1
        tol = t["id"].split("::")[0].endswith(TOLERANCE_FILES)
        if t["outcome"] == "passed":
            c["cases"] += int(t.get("cases", 1))
            c["tolerance_ok" if tol else "bit_exact"] += 1
        elif t["outcome"] in ("failed", "error", "xpassed"):
            c["failed"] += 1
            if c["first_failure"] is None:
                c["first_failure"] = {"test": t["id"], "message": t["message"]}
        elif t["outcome"] == "xfailed":
            c["xfailed"] += 1
        else:
            c["skipped"] += 1
    return [cells[k] for k in sorted(cells)]


def merge_reports(reports: list[dict], names: list[str] | None = None) -> dict:
    """One report from several runs of the same implementation on disjoint --methods (run in parallel):
    tests by id (a method-independent test run by several keeps its first outcome), counts and cells
    recomputed, the longest duration, the worst exit code, skip/xfail entries unmatched by every run."""
    tests: dict[str, dict] = {}
    for r in reports:
        for t in r["tests"]:
            tests.setdefault(t["id"], t)
    tl = list(tests.values())
    methods = {m for r in reports for m in r["methods"]}
    unmatched = [u for u in reports[0]["unmatched_skip_xfail"]
                 if all(u in r["unmatched_skip_xfail"] for r in reports[1:])]
    out = dict(reports[0])
    out.update(date=min(r["date"] for r in reports), duration_s=max(r["duration_s"] for r in reports),
               methods=[m for m in spec.METHODS if m in methods],
               pytest_exit_code=max(r["pytest_exit_code"] for r in reports), summary=_counts(tl),
               cells=_cells(tl, methods), tests=tl, unmatched_skip_xfail=unmatched)
    if names:
        out["merged_from"] = list(names)
    return out


def _versions(impl) -> dict:
    import hypothesis
    import pytest

    from .._env import versions
    v = versions({"pytest": pytest.__version__, "hypothesis": hypothesis.__version__})
    if impl is not None:
        v.update(impl.versions())
    return v


def _first_line(s: str | None, n: int = 90) -> str:
    if not s:
        return ""
    line = s.strip().splitlines()[0]
    return line if len(line) <= n else line[: n - 1] + "…"


def _skips(tests) -> str:
    """Skipped tests grouped by reason: count, reason, one example."""
    groups: dict[str, list[str]] = {}
    for t in tests:
        if t["outcome"] == "skipped":
            groups.setdefault(_skip_reason(t["message"]), []).append(t["id"])
    lines = [f"skipped {sum(map(len, groups.values()))}, by reason:"] if groups else []
    for reason, ids in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(ids):5d}  {reason}  (e.g. {ids[0]})")
    return "\n".join(lines)


def _table(cells) -> str:
    head = ("method", "bits", "dtype", "tests", "cases", "bit-exact", "tol-ok", "fail", "skip", "first failure")
    rows = [head]
    for c in cells:
        ff = c["first_failure"]
        rows.append((c["method"], c["bits"], c["dtype"], str(c["tests"]), str(c["cases"]), str(c["bit_exact"]),
                     str(c["tolerance_ok"]), str(c["failed"]), str(c["skipped"]),
                     "" if ff is None else f"{ff['test'].split('/')[-1]}: {_first_line(ff['message'])}"))
    w = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(r[j].ljust(w[j]) for j in range(len(w))) + "  " + r[-1])
        if i == 0:
            lines.append("  ".join("-" * x for x in w) + "  " + "-" * 13)
    return "\n".join(lines)


def exit_code(pytest_code: int, counts: dict) -> int:
    """pytest's code, but 1 when it says 0 and an xfail entry passed (conformance/xfail/README.md: an
    XPASS fails the CLI, the entry is stale)."""
    return 1 if pytest_code == 0 and counts.get("xpassed") else int(pytest_code)


def run(args) -> int:
    import pytest
    argv = [str(SUITE), "-p", "no:cacheprovider", "-p", "no:terminal",
            f"--impl={args.impl}", f"--hypothesis-profile={args.profile}"]
    if args.device:
        argv.append(f"--device={args.device}")
    if args.methods:
        argv.append(f"--methods={args.methods}")
    if args.keyword:
        argv += ["-k", args.keyword]
    if args.rules_report:
        argv.append(f"--rules-report={args.rules_report}")
    col = _Collector()
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"veloxquant conformance: impl={args.impl} device={args.device or 'default'} "
          f"methods={args.methods or 'all'} profile={args.profile}", flush=True)
    code = int(pytest.main(argv, plugins=[col]))
    if code in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERNAL_ERROR) or not col.total:
        # pytest printed the reason; an empty table would read as a run
        print(f"veloxquant conformance: no tests ran (pytest exit code {code})", file=sys.stderr)
        return code or 1
    tests = list(col.tests.values())
    for t in tests:
        if t["outcome"] == "skipped":
            t["message"] = _skip_reason(t["message"])
    selected = list(getattr(col.config, "_vq_methods", spec.METHODS)) if col.config else list(spec.METHODS)
    cells = _cells(tests, selected)
    counts = _counts(tests)
    code = exit_code(code, counts)
    impl = getattr(col.config, "_vq_impl", None) if col.config else None
    if impl is not None:
        print(f"device: {impl.device_name()}")
    print()
    print(_table(cells))
    print()
    if _skips(tests):
        print(_skips(tests))
        print()
    print("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v) +
          f" in {time.monotonic() - col.t0:.1f}s")
    failures = [t for t in tests if t["outcome"] in ("failed", "error", "xpassed")]
    for t in failures if args.verbose_failures else failures[:5]:
        print(f"\nFAILED {t['id']}\n  {t['message']}")
    if len(failures) > 5 and not args.verbose_failures:
        print(f"\n... {len(failures) - 5} more failures (--verbose-failures, or the JSON report)")
    rules = getattr(col.config, "_vq_rules_summary", None) if col.config else None
    if rules:   # pytest's own summary line is off here (-p no:terminal)
        print(f"spec rules: {rules['passed']} passed, {rules['failed']} failed, "
              f"{rules['not exercised']} not exercised (wrote {args.rules_report})")
    unmatched = getattr(col.config, "_vq_unmatched", []) if col.config else []
    for kind, pattern in unmatched:
        print(f"WARNING: {kind} entry {pattern!r} matched no collected test")
    if args.json:
        report = {
            "schema": SCHEMA,
            "date": started.isoformat(timespec="seconds"),
            "duration_s": round(time.monotonic() - col.t0, 3),
            "impl": impl.name if impl else args.impl,
            "device": impl.device_name() if impl else args.device,
            "methods": list(getattr(col.config, "_vq_methods", [])) if col.config else [],
            "profile": args.profile,
            "pytest_exit_code": code,
            "versions": _versions(impl),
            "summary": counts,
            "cells": cells,
            "tests": tests,
            "unmatched_skip_xfail": [{"kind": k, "test": p} for k, p in unmatched],
        }
        path = pathlib.Path(args.json)
        path.write_text(json.dumps(report, indent=1, default=str) + "\n")
        print(f"wrote {path}")
    return code
