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

import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
BASELINES = BENCHMARKS / "baselines"
# the baseline --gate compares with when none is named: the committed run of the device's kind (a GPU's by its
# name where one is saved, gate_baseline)
GATE = {"cpu": "cpu.json", "gpu": "h200.json"}
GPU_KINDS = ("h100", "h200")


def gate_baseline(device: str, gpu_name: str | None = None) -> pathlib.Path:
    """The committed run --gate compares with by default: the CPU's, or the GPU's kind (benchmarks/baselines/h100.json
    on an NVIDIA H100) where one is saved, else the H200's. `gpu_name`: the device's name (default: MLX's)."""
    if device == "gpu":
        if gpu_name is None:
            from .harness import device_info
            gpu_name = device_info()["name"]
        for kind in GPU_KINDS:
            if kind in gpu_name.lower() and (BASELINES / f"{kind}.json").exists():
                return BASELINES / f"{kind}.json"
    return BASELINES / GATE[device]
PASSTHROUGH = True


def add_arguments(p) -> None:
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="MLX device to measure on (default: cpu)")
    p.add_argument("--gate", nargs="?", const="", default=None, metavar="JSON",
                   help="fail each benchmark whose ratio regressed beyond its suite's noise band against this saved run "
                        f"(default: benchmarks/baselines/{GATE['cpu']} on the CPU; on a GPU its kind's, "
                        f"{' or '.join(k + '.json' for k in GPU_KINDS)}, else {GATE['gpu']})")
    p.add_argument("--json", type=pathlib.Path, default=None,
                   help="where the run's pytest-benchmark JSON goes (default: .benchmarks/<device>-<UTC time>.json, "
                        "ignored by git). Under benchmarks/baselines/ or docs/bench/ it is a kept run: "
                        "docs/benchmarks.md is re-rendered after it")
    p.add_argument("--markdown", type=pathlib.Path, default=None,
                   help="also write this run's rendered tables (printed after the run) into this markdown file")
    p.epilog = ("Anything after -- goes to pytest: paths under benchmarks/, -k, --bench-contexts, --bench-batches, "
                "--bench-arms, --bench-kv (benchmarks/conftest.py), e.g. "
                "veloxquant bench --device gpu -- --bench-contexts 32768 131072. Runs from a source checkout "
                "(pip install -e '.[dev]'): benchmarks/ is not in the wheel.")


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
        gate = pathlib.Path(args.gate) if args.gate else gate_baseline(args.device)
        cmd += ["--bench-gate", str(gate)]
    return cmd + extra


def kept(path: pathlib.Path) -> bool:
    """A run docs/benchmarks.md renders (render.default_runs: baselines and docs/bench/)."""
    where = path.resolve().parent
    return where in (BASELINES.resolve(), (ROOT / "docs" / "bench").resolve())


def _cannot_run(args) -> str | None:
    """Why this run cannot start here (one line), or None: no checkout, no pytest-benchmark, no GPU for --device gpu."""
    import importlib.util
    if not BENCHMARKS.is_dir():
        return (f"no {BENCHMARKS} here; the benchmarks run from a source checkout "
                "(git clone, then pip install -e '.[dev]')")
    if importlib.util.find_spec("pytest_benchmark") is None:
        return "needs pytest-benchmark, not installed here; install the extra with: pip install -e '.[dev]'"
    if args.device == "gpu":
        import mlx.core as mx
        if not mx.is_available(mx.gpu):
            return "--device gpu, but this MLX build has no GPU"
    return None


def run(args) -> int:
    why = _cannot_run(args)
    if why:
        print(f"veloxquant bench: {why}", file=sys.stderr)
        return 2
    # pytest runs in ROOT: the paths typed are the caller's, so they go to it absolute
    args.json = args.json.resolve() if args.json else None
    args.gate = str(pathlib.Path(args.gate).resolve()) if args.gate else args.gate
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
    # this run alone, rendered (ours ÷ the baseline in the same rounds: the figures the README and docs quote)
    section = "\n".join(render.render(json.loads(json_path.read_text()), render.shown(json_path))) + "\n"
    print("\n" + section, flush=True)
    print(f"bench: wrote {json_path}")
    if args.markdown:
        args.markdown.write_text(section)
        print(f"bench: wrote {args.markdown}")
    if kept(json_path):
        render.main(["--write", str(ROOT / "docs" / "benchmarks.md")])
    return rc
