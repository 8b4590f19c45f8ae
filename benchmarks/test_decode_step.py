"""The decode step per layer, as a model runs it: append one token to each layer's cache and attend through
mlx-lm's base.scaled_dot_product_attention (the hooked dispatch), several layers per evaluation, each layer's output
the next one's query (tools/bench/arms.py's step, bench-decode's). Ours against mlx-lm's fp16 KVCache at the same context, timed in
the same rounds; gated: ours / fp16 per round (median)."""
from __future__ import annotations

import pytest

import harness

pytest.importorskip("mlx_lm")


@pytest.mark.parametrize("arm", list(harness.ALL_ARMS))
def test_decode_step(benchmark, bench, request, arm):
    import mlx.core as mx

    from veloxquant.tools.bench import arms as bench_arms
    from veloxquant.tools.bench.harness import D, HKV, HQ
    harness.skip_unless_measured(bench.device, "decode_step", arm)
    sz = bench.sizes["decode_step"]
    t, layers = sz["context"], sz["layers"]
    caches = {}
    for name in ("fp16 KVCache", arm):
        caches[name] = bench_arms.make(name, layers)
        bench_arms.prefill(caches[name], t, lambda *a: None)
    pool = [tuple(mx.random.normal((1, h, 1, D), key=mx.random.key(100 * j + i)).astype(mx.float16)
                  for j, h in enumerate((HQ, HKV, HKV))) for i in range(harness.POOL)]
    mx.eval(pool)

    def step(name, i):
        mx.eval(bench_arms.step(caches[name], *pool[i]))

    benchmark.group = f"decode step, {layers} layers, context {t}"
    res = harness.paired(benchmark, lambda i: step(arm, i), {"fp16": lambda i: step("fp16 KVCache", i)},
                         rounds=sz["rounds"], warmup=sz["warmup"],
                         info=dict(suite="decode_step", arm=arm, context=t, layers=layers,
                                   bytes_per_layer=bench_arms.nbytes(caches[arm]) / layers,
                                   fp16_bytes_per_layer=bench_arms.nbytes(caches["fp16 KVCache"]) / layers))
    bench.gate(request, "decode_step", res)
