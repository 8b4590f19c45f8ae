"""Run environment recorded in every tool's JSON output (command, UTC time, device, versions, git revision).

Shared by tools/bench/, tools/quality/, tools/dev/ and tools/cli/conformance.py so that their reports name the same
things the same way: `run_record` opens a record. The versions never raise for a missing piece: absent packages
and git give None (run_record's default device description needs MLX).
"""
from __future__ import annotations

import datetime
import pathlib
import platform
import shlex
import subprocess
import sys
from importlib import metadata

import numpy as np

from .. import spec
from .bench.harness import device_info   # a leaf that imports MLX only when called


ROOT = pathlib.Path(__file__).resolve().parent.parent


def utc_now_iso() -> str:
    """The current UTC time, ISO 8601 to the second (`2026-11-29T16:32:06+00:00`)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def command_line(prog: str, argv=None, quote: bool = False) -> str:
    """`prog` and its arguments (`argv`, by default this process's sys.argv[1:]) as one line; `quote` shell-quotes
    each argument, so that the line pastes back into a shell."""
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join([prog, *(map(shlex.quote, args) if quote else args)])


def run_record(prog: str, argv=None, device=None, quote: bool = False) -> dict:
    """What every tool's JSON record names, in these keys: "command" (`command_line(prog, argv, quote)`), "date",
    "device" (`device` where given, else `device_info()`, which imports MLX) and "versions"."""
    return {"command": command_line(prog, argv, quote), "date": utc_now_iso(),
            "device": device_info() if device is None else device, "versions": versions()}


def versions(extra: dict | None = None) -> dict:
    """spec, python, veloxquant, mlx, mlx-lm, numpy and git short hash (None where absent), then `extra`."""
    v = {"spec": spec.SPEC_VERSION, "python": platform.python_version(), "veloxquant": _veloxquant(),
         "mlx": _mlx(), "mlx-lm": _dist("mlx-lm"), "numpy": np.__version__, "git": _git()}
    v.update(extra or {})
    return v


def _veloxquant() -> str | None:
    try:
        return metadata.version("veloxquant")
    except metadata.PackageNotFoundError:  # run from the source tree (e.g. the GPU box): read pyproject.toml
        try:
            with open(ROOT / "pyproject.toml", "rb") as f:
                return spec.tomllib.load(f)["project"]["version"] + " (source tree)"
        except (OSError, KeyError):
            return None


def _mlx() -> str | None:
    # The module's own version: the wheel may be installed as `mlx` or as a backend-specific distribution.
    try:
        import mlx.core as mx
    except ImportError:
        return None
    return mx.__version__


def _dist(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git() -> str | None:
    # A copy of the tree without its history (the GPU machine gets the working tree, and a stale .git at
    # best) is told its revision by VELOXQUANT_GIT (tree state committed before the run).
    import os
    if os.environ.get("VELOXQUANT_GIT"):
        return os.environ["VELOXQUANT_GIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
