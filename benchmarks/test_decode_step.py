"""The decode step per layer, as a model runs it: append one token to each layer's cache and attend through
mlx-lm's base.scaled_dot_product_attention (the hooked dispatch), several layers per evaluation, each layer's output
the next one's query (tools/bench/arms.py's step). Ours, and with --device gpu mlx-lm's
QuantizedKVCache (q4, q8), against mlx-lm's fp16 KVCache at the same context, timed in the same rounds; gated:
ours / fp16 per round (median). At each context of --bench-contexts; --bench-arms names other arms (an A/B of
tuning knobs: arms interleaved in one process, never two runs); the fp16 caches are prefilled once per context
and trimmed back to it after each benchmark."""
from __future__ import annotations

import pytest

import harness

pytest.importorskip("mlx_lm")
SUITE = "decode_step"
ARMS = [*harness.ALL_ARMS, *harness.MLX_Q]      # the `arm` parameters, with --bench-kv's (conftest.py)


def test_decode_step(benchmark, bench, request, arm, context):
    import mlx.core as mx

    from veloxquant.tools.bench import arms as bench_arms
    from veloxquant.tools.bench.harness import D, HKV, HQ
    harness.skip_unless_measured(bench.device, SUITE, arm, bench.named_arms)
    harness.skip_unless_mlx_q_works(arm)
    sz = bench.sizes[SUITE]
    t, layers = context, sz["layers"]

    def fp16():
        caches = bench_arms.make("fp16 KVCache", layers)
        bench_arms.prefill(caches, t, lambda *a: None)
        return caches
    caches = {"fp16 KVCache": harness.shared(SUITE, (t, layers), fp16), arm: bench_arms.make(arm, layers)}
    with bench_arms.knobs(arm):      # an arm's tuning knobs (--bench-arms "turboquant b4 [FUSE_COMBINE=1]")
        bench_arms.prefill(caches[arm], t, lambda *a: None)
    pool = [tuple(mx.random.normal((1, h, 1, D), key=mx.random.key(100 * j + i)).astype(mx.float16)
                  for j, h in enumerate((HQ, HKV, HKV))) for i in range(harness.POOL)]
    mx.eval(pool)

    def step(name, i):
        with bench_arms.knobs(name):
            mx.eval(bench_arms.step(caches[name], *pool[i]))

    benchmark.group = f"decode step, {layers} layers, context {t}"
    try:
        res = harness.paired(benchmark, lambda i: step(arm, i), {"fp16": lambda i: step("fp16 KVCache", i)},
                             rounds=sz["rounds"], warmup=sz["warmup"],
                             info=dict(suite=SUITE, arm=arm, **harness.cache_settings(arm), context=t, layers=layers,
                                       bytes_per_layer=bench_arms.nbytes(caches[arm]) / layers,
                                       fp16_bytes_per_layer=t * HKV * D * 2 * 2))
    finally:     # the shared fp16 caches back to the context for the next arm
        for c in caches["fp16 KVCache"]:
            c.trim(c.offset - t)
    bench.gate(request, SUITE, res)
