"""Run environment recorded in every tool's JSON output (versions, git revision, UTC time).

Shared by tools/bench/, tools/quality/ and tools/cli/conformance.py so that their reports name the same
things the same way. Nothing here raises for a missing piece: absent packages and git give None.
"""
from __future__ import annotations

import datetime
import pathlib
import platform
import subprocess
from importlib import metadata

import numpy as np

from .. import spec

ROOT = pathlib.Path(__file__).resolve().parent.parent


def utc_now_iso() -> str:
    """The current UTC time, ISO 8601 to the second (`2026-11-29T16:32:06+00:00`)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


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
