"""Running benchmarks/ in-process in tests: a stand-in for pytest-benchmark's fixture and the benchmark modules
loaded as pytest loads them."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Benchmark:
    """What benchmarks/harness.py paired() uses of pytest-benchmark's fixture, running every round untimed."""
    def __init__(self):
        self.extra_info, self.stats, self.group = {}, None, None

    def pedantic(self, target, setup, teardown, rounds, warmup_rounds):
        for _ in range(rounds + warmup_rounds):
            args, kw = setup()
            target(*args, **kw)
            teardown()


def benchmark_module(name: str, monkeypatch):
    """benchmarks/<name>.py loaded as pytest loads it (benchmarks/ on sys.path for its `import harness`)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.delitem(sys.modules, "harness", raising=False)
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
