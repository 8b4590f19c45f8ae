"""tools/dev/generate_split.py's plumbing on the CPU (its clock needs CUDA): with a stand-in clock, each arm's forwards
run under its knobs, the GPU-timed forwards take the gate's copy of the token (so nothing of them starts before the
hold ends), every part is reported per token, and the side that sets the pace is the larger one. What the numbers
mean on a GPU is checked only where it runs."""
from __future__ import annotations

import mlx.core as mx
import pytest

from veloxquant.tools.dev import generate_split as gs

pytest.importorskip("mlx_lm")
MARK = 7        # the stand-in gate's copies are the token plus MARK: a forward that reads one is told apart


class Clock:
    """gpu_clock's calls: a hold and a stamp 2 ms apart, an overhead of 0.5 ms, a gate that marks its copies."""

    def __init__(self):
        self.gates = 0

    def hold(self):
        return mx.array([1_000_000], dtype=mx.int64)

    def gate(self, arrays, dep):
        self.gates += 1
        return [a + MARK for a in arrays]

    def stamp(self, x):
        return mx.array([3_000_000], dtype=mx.int64)

    def span_s(self, th, te):
        return (int(te.item()) - int(th.item())) * 1e-9

    def overhead_s(self, arrays):
        return 0.5e-3


def test_measure_reports_each_part_per_token_under_the_arms_knobs(monkeypatch):
    from veloxquant.accelerated import tuning
    from veloxquant.tools.bench import arms as bd
    clock, knobs = Clock(), set()
    real_model = bd.model

    def model(n, shape):
        net, args = real_model(n, shape)
        call = type(net).__call__

        def spy(self, inputs, cache=None, **kw):
            knobs.add(tuning.current().fuse_combine)
            return call(self, inputs, cache=cache, **kw)
        monkeypatch.setattr(type(net), "__call__", spy)
        return net, args
    monkeypatch.setattr(bd, "model", model)
    arms = ["fp16 KVCache", "turboquant b4 [FUSE_COMBINE=1]"]
    with mx.stream(mx.cpu):
        res = gs.measure(arms, context=64, n_layers=1, tokens=2, rounds=1, shape="cpu", clock=clock,
                         log=lambda *a: None)
    assert list(res) == arms
    for arm, row in res.items():
        assert set(row) == {"build_s", "encode_s", "gpu_s", "wall_s", "paced_by"}, (arm, row)
        assert row["build_s"] > 0 and row["encode_s"] >= 0 and row["wall_s"] > 0, (arm, row)
        assert row["gpu_s"] == pytest.approx(1.5e-3), (arm, row["gpu_s"])       # the span less the overhead
        host = row["build_s"] + row["encode_s"]
        assert row["paced_by"] == ("host" if host >= row["gpu_s"] else "gpu"), (arm, row)
    assert knobs == {False, True}, f"the arms' knobs were not each in effect for their forwards: {knobs}"
    assert tuning.current() == tuning.DEFAULT


def test_the_gpu_timed_forwards_read_the_gate_copy():
    """token_times' timed forwards must read the gate's copy of the token, or the GPU could start them before the
    hold ends and the span would miss their work; the host-timed forwards read the token itself."""
    clock, seen = Clock(), []

    class Net:
        def __call__(self, x, cache=None):
            seen.append(int(x.reshape(-1)[0].item()))
            return x.astype(mx.float32) * 2
    with mx.stream(mx.cpu):
        gs.token_times(Net(), None, mx.array([1], dtype=mx.int32), clock, reps=3)
    assert seen == [1, 1, 1, 1 + MARK, 1 + MARK, 1 + MARK] and clock.gates == 3, seen
