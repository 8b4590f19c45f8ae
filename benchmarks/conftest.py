"""pytest options of the benchmarks: the device, the gate against a saved baseline, and what the saved JSON records
(command, device, versions, sizes, bands) for tools/bench/render.py."""
from __future__ import annotations

import pathlib
import shlex
import sys

import pytest

import harness


def pytest_addoption(parser):
    g = parser.getgroup("veloxquant benchmarks")
    # conformance/conftest.py defines the same --device (cpu | gpu, default MLX's): when it was loaded first, use its
    defined = {n for grp in [parser._anonymous, *parser._groups] for o in grp.options for n in o.names()}
    if "--device" not in defined:
        g.addoption("--device", choices=["cpu", "gpu"], default=None,
                    help="MLX device to measure on (default: MLX's default device); sizes follow it")
    g.addoption("--bench-gate", default=None, metavar="JSON",
                help="fail each benchmark whose ratio to its baseline arm exceeds this saved run's (a pytest-benchmark "
                     "JSON of these benchmarks, e.g. benchmarks/baselines/cpu.json) by more than the suite's noise "
                     "band (benchmarks/harness.py BANDS)")
    g.addoption("--bench-band", type=float, default=None, metavar="FRACTION",
                help="one noise band for every suite instead of harness.BANDS (e.g. 0.1)")


class Bench:
    """What a benchmark needs from the session: the device type, its sizes, the gate."""

    def __init__(self, config):
        import mlx.core as mx
        want = config.getoption("--device")
        self.skip = None
        if want == "gpu" and not mx.is_available(mx.gpu):
            self.skip = "--device gpu: this MLX build has no GPU"
        elif want is not None:
            mx.set_default_device(mx.gpu if want == "gpu" else mx.cpu)
        self.device = "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"
        self.sizes = harness.SIZES[self.device]
        gate = config.getoption("--bench-gate")
        self.gate_path = pathlib.Path(gate) if gate else None
        if self.gate_path is not None and not self.gate_path.is_file():
            raise pytest.UsageError(f"--bench-gate: no such file {gate!r}")
        self.baseline = harness.load_ratios(self.gate_path) if self.gate_path else {}
        self.band = config.getoption("--bench-band")
        self.slow_update = harness.slow_update_mutant()

    def gate(self, request, suite: str, result: dict) -> None:
        """Fails the test when a ratio regressed beyond the band (only with --bench-gate)."""
        if self.gate_path is None:
            return
        bad = harness.check(request.node.nodeid, suite, result["ratios"], self.baseline, self.band)
        if bad:
            pytest.fail("benchmark gate (" + str(self.gate_path) + "):\n" + "\n".join(bad), pytrace=False)


def pytest_configure(config):
    config._veloxquant_bench = Bench(config)


def pytest_collection_modifyitems(config, items):
    why = config._veloxquant_bench.skip
    if why:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def bench(pytestconfig) -> Bench:
    return pytestconfig._veloxquant_bench


def pytest_benchmark_update_json(config, benchmarks, output_json):
    """The run's context for the renderer and the gate: the command, device, versions, sizes, bands."""
    from veloxquant.tools._env import versions
    from veloxquant.tools.bench.harness import device_info
    b = config._veloxquant_bench
    info = device_info()
    info["type"] = b.device
    output_json["veloxquant"] = {
        "command": " ".join(["pytest", *map(shlex.quote, sys.argv[1:])]),
        "device": info, "versions": versions(), "sizes": b.sizes, "bands": harness.BANDS,
        **({"slow_update_s": b.slow_update} if b.slow_update else {}),
    }
