"""`veloxquant bench`: the one benchmark harness's front end. It runs `pytest benchmarks` (benchmarks/: pytest-benchmark,
each arm of ours timed against its baseline in the same rounds, benchmarks/harness.py) on the chosen device, saves the
run's JSON, and renders it: every speed number in docs/benchmarks.md and the README comes from such a run.

    veloxquant bench                                    # the CPU's quick sizes; JSON in .benchmarks/
    veloxquant bench --device gpu --gate                # and fail on a ratio beyond benchmarks/harness.py BANDS
    veloxquant bench --json benchmarks/baselines/cpu.json   # a new baseline; docs/benchmarks.md re-rendered
    veloxquant bench --device gpu -- --bench-contexts 32768 131072 --bench-arms "turboquant b4" "turboquant b4 [FUSE_COMBINE=1]"

Anything after `--` goes to pytest (paths under benchmarks/, -k, --bench-contexts, --bench-batches, --bench-arms,
--bench-kv, ...: benchmarks/conftest.py). benchmarks/ lives in the source checkout (a wheel has none).
"""
from __future__ import annotations

import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
BASELINES = BENCHMARKS / "baselines"
# the baseline --gate compares with when none is named: the committed run of the device's kind
GATE = {"cpu": "cpu.json", "gpu": "h200.json"}
PASSTHROUGH = True


def add_arguments(p) -> None:
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="MLX device to measure on (default: cpu)")
    p.add_argument("--gate", nargs="?", const="", default=None, metavar="JSON",
                   help="fail each benchmark whose ratio regressed beyond its suite's noise band against this saved run "
                        f"(default: benchmarks/baselines/{GATE['cpu']} on the CPU, {GATE['gpu']} on the GPU)")
    p.add_argument("--json", type=pathlib.Path, default=None,
                   help="where the run's pytest-benchmark JSON goes (default: .benchmarks/<device>-<UTC time>.json, "
                        "ignored by git). Under benchmarks/baselines/ or docs/bench/ it is a kept run: "
                        "docs/benchmarks.md is re-rendered after it")
    p.add_argument("--markdown", type=pathlib.Path, default=None,
                   help="also render this run alone into this markdown file")


def pytest_command(args, json_path: pathlib.Path) -> list[str]:
    """The pytest command line of a run: benchmarks/ (or the paths given after --), the device, the JSON, a partial JSON
    rewritten after each benchmark (a run cut short keeps what it measured), the gate."""
    extra = list(getattr(args, "passthrough", None) or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    targets = [] if any(a.startswith("benchmarks") for a in extra) else ["benchmarks"]     # run in ROOT
    cmd = [sys.executable, "-m", "pytest", *targets, "-p", "no:cacheprovider", "-q", "-rs", "--device", args.device,
           "--benchmark-json", str(json_path), "--bench-partial", str(json_path.with_suffix(".partial.json")),
           "--benchmark-columns=median,iqr,rounds"]
    if args.gate is not None:
        gate = pathlib.Path(args.gate) if args.gate else BASELINES / GATE[args.device]
        cmd += ["--bench-gate", str(gate)]
    return cmd + extra


def kept(path: pathlib.Path) -> bool:
    """A run docs/benchmarks.md renders (render.default_runs: baselines and docs/bench/)."""
    where = path.resolve().parent
    return where in (BASELINES.resolve(), (ROOT / "docs" / "bench").resolve())


def run(args) -> int:
    if not BENCHMARKS.is_dir():
        print(f"bench: no {BENCHMARKS} here; the benchmarks run from a source checkout", file=sys.stderr)
        return 2
    json_path = args.json or ROOT / ".benchmarks" / f"{args.device}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = pytest_command(args, json_path)
    print("bench: " + " ".join(cmd[1:]), flush=True)
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    if not json_path.is_file():
        print(f"bench: pytest exited {rc} without writing {json_path}", file=sys.stderr)
        return rc or 1
    json_path.with_suffix(".partial.json").unlink(missing_ok=True)
    from . import render     # (not at import: `python -m veloxquant.tools.bench.render` imports this package first)
    print(f"bench: wrote {json_path}")
    if args.markdown:
        args.markdown.write_text(render.page([json_path]))
        print(f"bench: wrote {args.markdown}")
    if kept(json_path):
        render.main(["--write", str(ROOT / "docs" / "benchmarks.md")])
    return rc
