"""Optional dependencies, grouped as pyproject.toml's extras, and the one line a command prints when the
extra it needs is not installed (instead of a ModuleNotFoundError traceback halfway through its work).

`pip install veloxquant` brings numpy and MLX: enough for `golden` and `codebooks` (`bench` runs benchmarks/ from a checkout, with pytest-benchmark: [dev]).
The rest come with an extra named for what it is for (pyproject.toml [project.optional-dependencies];
tests/test_cli_config.py checks the two agree).
"""
from __future__ import annotations

import importlib.util

# extra -> (import name, distribution name) of what it brings that our commands import
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "lm": (("mlx_lm", "mlx-lm"), ("tokenizers", "tokenizers")),      # generate, serve, the caches, tiny_model
    "conformance": (("pytest", "pytest"), ("hypothesis", "hypothesis")),
    "plots": (("matplotlib", "matplotlib"),),
}
# The exit status of a command whose extra is missing: argparse's usage status, like a bad flag.
MISSING_EXTRA_EXIT = 2


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # a parent package missing, or a module without a spec
        return False


def missing(*extras: str) -> list[tuple[str, str]]:
    """(extra, distribution) for each module of `extras` that cannot be imported here."""
    return [(extra, dist) for extra in extras for module, dist in EXTRAS[extra] if not _installed(module)]


def message(prog: str, *extras: str) -> str | None:
    """One line naming what is missing and the install command, or None when everything is there."""
    gone = missing(*extras)
    if not gone:
        return None
    names = sorted({e for e, _ in gone}, key=list(EXTRAS).index)
    dists = ", ".join(d for _, d in gone)
    return (f"{prog}: needs {dists}, not installed here; install the extra with: "
            f"pip install 'veloxquant[{','.join(names)}]'")
