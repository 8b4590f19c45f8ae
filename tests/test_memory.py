"""Memory of the decoded copies a prefill makes (accelerated/ops/attention.py PackedRecord.dequantized) and the
`veloxquant memory` tool (tools/bench/memory.py) at a tiny size.

The decoded copy of a record (prefill attention over more than MAX_PACKED_QUERIES queries, dequantize-mode
caches) must equal the stream's decode cast to the input dtype, bit for bit, and must not hold a float32 copy
of the whole record: built eagerly block by block, its peak above the result is about one block's
temporaries."""
from __future__ import annotations

import gc

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import tuning
from veloxquant.accelerated.stream import Stream
from veloxquant import spec

SETTINGS = {
    "turboquant": dict(bits=4, window=5),
    "turboquant_rvq": dict(bits=2, bits2=2),
    "turboquant_prod": dict(bits=3),
    "kivi": dict(bits=2, group_size=32, window=7),
    "rabitq": dict(bits=1),
}


@pytest.mark.parametrize("role", ["k", "v"])
@pytest.mark.parametrize("method", list(SETTINGS))
def test_blocked_decoded_copy_equals_stream_decode(method, role, monkeypatch, tune):
    tune(attention_block=64)          # several blocks (and a partial one) at a small T
    s = Stream(spec.Params(method, role=role, seed=3, **SETTINGS[method]))
    x = mx.random.normal((1, 2, 64 * 3 + 45, 64), key=mx.random.key(1)).astype(mx.float16)
    s.append(x)
    want = np.array(s.dequantized().astype(mx.float16))
    for eager in (False, True):
        got = s.packed().dequantized(mx.float16, eager)
        assert got.dtype == mx.float16
        np.testing.assert_array_equal(np.array(got), want)
    np.testing.assert_array_equal(np.array(s.packed().dequantized()), np.array(s.dequantized()))


def _peak_above(fn) -> int:
    gc.collect()
    mx.clear_cache()
    mx.synchronize()
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    out = fn()
    mx.eval(out)
    peak = mx.get_peak_memory() - base - out.nbytes
    del out
    return peak


def test_prefill_decoded_copy_holds_one_block_at_a_time():
    """Eager: peak above the float16 result < half a float32 copy of the whole record (8 blocks; measured
    0.31: one block's temporaries, ~2.5 float32 blocks); the lazy build keeps every block's temporaries
    (measured 1.75 float32 copies)."""
    c = vc.TurboQuantKVCache(4, window=0)
    t = 8 * tuning.current().attention_block
    k = mx.random.normal((1, 1, t, 64), key=mx.random.key(2)).astype(mx.float16)
    c.update_and_fetch(k, k)
    rec = c._k.packed()
    mx.eval(list(rec.fields.values()), rec.window)  # the record is stored before anything is measured
    f32_copy = t * 64 * 4
    eager = _peak_above(lambda: rec.dequantized(mx.float16, eager=True))
    lazy = _peak_above(lambda: rec.dequantized(mx.float16, eager=False))
    assert eager < f32_copy / 2, (eager, f32_copy)
    if mx.default_device() == mx.cpu:   # what the eager build avoids: MLX's evaluation order, seen on the CPU
        assert lazy > f32_copy, (lazy, f32_copy)


def test_memory_tool_small(capsys):
    from veloxquant.tools.bench import memory
    model = memory.build_model("small", 2)
    rows = [memory.measure(model, arm, 300, 128, 2, lambda *a: None)
            for arm in ("fp16 KVCache", "turboquant b4", "kivi b4")]
    fp16, tq, kivi = rows
    for r in rows:
        assert r["prefill_peak"] >= r["cache_bytes"] > 0 and r["decode_peak"] >= r["cache_bytes"]
        assert r["fp16_tokens_bytes"] == 2 * 2 * 2 * 64 * 2 * 300     # K+V, layers, heads, d, fp16, tokens
    assert tq["cache_bytes"] < 0.4 * fp16["cache_bytes"] and kivi["cache_bytes"] < 0.6 * fp16["cache_bytes"]
    res = {"command": "veloxquant memory ...", "date": "2026-11-30T00:00:00+00:00", "device": {"type": "cpu"},
           "versions": {}, "shape": "small", "shape_args": memory.SHAPES["small"], "layers": 2, "prefill_step": 128,
           "decode_tokens": 2, "rows": rows}
    table = memory.render(res)
    assert sum(line.startswith("| 300 |") for line in table) == 3
