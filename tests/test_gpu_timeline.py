"""tools/dev/gpu_timeline.py's bookkeeping on the CPU (its clock needs CUDA): the recorder stamps every launch of the
kernels it wraps (not the clock's own), in launch order, only while on; spans and layers read the stamps as the
chain's shares. The stamps' GPU meaning is checked only where it runs (an H200 run)."""
from __future__ import annotations

import json

import mlx.core as mx

from veloxquant.tools.bench import gpu_clock
from veloxquant.tools.dev import gpu_timeline as tl


def _fake_factory(made):
    def make(*, name, **kw):
        made.append(name)
        return lambda **call: [mx.zeros((1,))]
    return make


def test_recorder_stamps_each_launch_in_order_while_on():
    made, stamped = [], []
    rec = tl.Recorder(stamp=lambda x: stamped.append(1) or mx.array([len(stamped)]))
    make = rec.wrap(_fake_factory(made))
    gate, part, comb = (make(name=n) for n in ("vq_gate_2_1024_1024", "vq_attention_partial_0000t2_0123456789",
                                                "vq_attention_combine_abcdefabcd"))
    clock = make(name="vq_clock_stamp")
    gate()
    assert rec.marks == [], "stamped while off"
    rec.on = True
    for k in (gate, part, comb, clock):
        k()
    rec.on = False
    part()
    assert [n for n, _ in rec.marks] == ["vq_gate_2_1024_1024", "vq_attention_partial_0000t2_0123456789",
                                         "vq_attention_combine_abcdefabcd"], rec.marks
    assert [int(m.item()) for _, m in rec.marks] == [1, 2, 3] and len(stamped) == 3


def test_spans_and_layers_read_consecutive_stamps():
    marks = [("vq_append_turboquant_turboquant_apart_0123456789", 1_005_000),
             ("vq_attention_partial_0000t2_0123456789", 1_023_000), ("vq_attention_combine_0123456789", 1_030_000),
             ("vq_gate_2_1024_1024", 1_032_500), ("vq_attention_partial_0000t2a_0123456789", 1_070_000),
             ("vq_attention_combine_0123456789", 1_077_000)]
    rows = tl.spans(1_000_000, marks)
    assert [r[0] for r in rows] == ["vq_append_turboquant_turboquant_apart", "vq_attention_partial_0000t2",
                                    "vq_attention_combine", "vq_gate", "vq_attention_partial_0000t2a",
                                    "vq_attention_combine"]
    assert [round(r[2], 1) for r in rows] == [5.0, 18.0, 7.0, 2.5, 37.5, 7.0] and round(rows[-1][1], 1) == 77.0
    per_layer = tl.layers(rows)
    assert [[n for n, _ in layer] for layer in per_layer] == [
        ["vq_append_turboquant_turboquant_apart", "vq_attention_partial_0000t2", "vq_attention_combine"],
        ["vq_gate", "vq_attention_partial_0000t2a", "vq_attention_combine"]]


def test_measure_runs_a_step_through_the_recorder(monkeypatch):
    """measure() end to end with stand-in kernels (zeros of the launch's output shapes) and a counting clock: one
    row per layer, each a gate (but the first), the append, the partial and the combine (with the append inside the
    partial launch: no append launch), then the per-layer total."""
    from veloxquant.accelerated import kernels
    from veloxquant.accelerated.kernels import attention as katt
    from veloxquant.accelerated.kernels import backend
    from veloxquant.tools.bench import gpu_clock
    ticks = []

    def clock(x=None):
        ticks.append(1)
        return mx.array([1000 * len(ticks)], dtype=mx.int64)

    def fake_cuda_kernel(*, name, **kw):
        return lambda inputs, output_shapes, output_dtypes, **call: [mx.zeros(s, dtype=d) for s, d in
                                                                     zip(output_shapes, output_dtypes)]
    for m in (backend, kernels):
        monkeypatch.setattr(m, "available", lambda: (True, "stand-in kernels"))
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("cuda", "stand-in kernels"))
    monkeypatch.setattr(mx.fast, "cuda_kernel", fake_cuda_kernel)
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 132)
    monkeypatch.setattr(gpu_clock, "hold", lambda ns=0: clock())
    monkeypatch.setattr(gpu_clock, "stamp", clock)
    monkeypatch.setattr(gpu_clock, "gate", lambda arrays, dep: list(arrays))
    from veloxquant.accelerated import attention as vattention
    from veloxquant.accelerated.cache import base as cache_base
    from veloxquant.accelerated.kernels import append, commit
    from veloxquant.accelerated.kernels import methods as km
    # every cache that could keep a stand-in kernel object (or a plan holding one) past this test
    cleared = [f for m in (backend, katt, append, commit, km, vattention, cache_base, gpu_clock)
               for f in vars(m).values() if callable(getattr(f, "cache_clear", None))]
    for f in cleared:
        f.cache_clear()
    try:
        res = tl.measure(["turboquant b4 [FUSE_APPEND=0]", "turboquant b4"], 40, 2, 2, log=lambda *a: None)
    finally:
        for f in cleared:
            f.cache_clear()
    rows = res["turboquant b4 [FUSE_APPEND=0]"]
    assert [[n.split("_")[1] for n, _ in r] for r in rows[:2]] == [["append", "attention", "attention"]] * 2, rows
    assert rows[2][0][0] == "total" and all(d > 0 for r in rows for _, d in r), rows
    # the default: the append inside the partial launch, the combine after it writing the token's summary
    rows = res["turboquant b4"]
    assert [[n for n, _ in r] for r in rows[:2]] == [["vq_attention_partial_0000t2a", "vq_attention_combine_a"]] * 2, \
        rows


def test_json_says_what_ran_where(monkeypatch, tmp_path):
    """--json: the per-layer table with its date, device, versions and command, as every benchmark JSON of
    docs/bench carries them."""
    rows = {"turboquant b4": [[["vq_attention_partial", 16.0]], [["total", 16.0]]]}
    monkeypatch.setattr(gpu_clock, "available", lambda: (True, "stand-in"))
    monkeypatch.setattr(tl, "measure", lambda arms, context, layers, steps, chain=False: rows)
    monkeypatch.setattr(mx, "set_default_device", lambda d: None)
    out = tmp_path / "t.json"
    assert tl.main(["--context", "64", "--arms", "turboquant b4", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    for k in ("date", "device", "versions", "command", "unit"):
        assert d.get(k), f"gpu_timeline --json: no {k!r} in {sorted(d)}"
    assert d["command"].endswith("--context 64 --arms 'turboquant b4' --json " + str(out)), d["command"]
    assert d["arms"] == rows and d["context"] == 64


def test_chained_gate_puts_the_gates_stamp_in_the_chain(monkeypatch):
    """--chain: the gate's mark is a stamp of its copies that a second, unrecorded gate waits on, so the layer's
    next launch starts after the stamp ran (the recorded, off-chain stamp can be held back by a full partial)."""
    calls = []
    rec = tl.Recorder(stamp=lambda x: ("off-chain", x))

    def gate(arrays, dep):          # gpu_clock.gate as the recorder sees it: a recorded launch while on
        outs = [f"{a}'" for a in arrays]
        calls.append((tuple(arrays), dep))
        if rec.on:
            rec.marks.append(("vq_gate_2", rec._stamp(outs[0])))
        return outs
    monkeypatch.setattr(gpu_clock, "gate", gate)
    monkeypatch.setattr(gpu_clock, "stamp", lambda x: ("chained", x))
    rec.on = True
    out = tl.chained_gate(rec)(["k", "v"], "x")
    assert rec.on, "chained_gate left the recorder off"
    assert rec.marks == [("vq_gate_2", ("chained", "k'"))], f"chained_gate(['k', 'v'], 'x'): marks {rec.marks}"
    assert calls == [(("k", "v"), "x"), (("k'", "v'"), ("chained", "k'"))], f"chained_gate: gate calls {calls}"
    assert out == ["k''", "v''"], out
