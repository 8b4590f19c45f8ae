"""End-to-end generation as a user runs it: mlx_lm.generate.generate_step on a small random llama, our caches
(make_prompt_cache; with --device gpu also mlx-lm's QuantizedKVCache q4 / q8) against mlx-lm's fp16 KVCache, timed
in the same rounds; ours / fp16 per round (median) is gated, a ratio of times per token (the inverse of the tokens/s
ratio). At each context of --bench-contexts: the prompt is run through the model once per context into the fp16
caches (untimed); each arm's caches are filled with the keys and values the model wrote there (the same prompt's
prefill without running the model again). Each round then generates `tokens` more tokens in each, continuing the
same generation (so both caches grow alike over the rounds); the fp16 caches are trimmed back to the prompt after
each benchmark."""
from __future__ import annotations

import pytest

import harness

pytest.importorskip("mlx_lm")
SUITE = "generate"
ARMS = [*harness.ALL_ARMS, *harness.MLX_Q]      # the `arm` parameters, with --bench-kv's (conftest.py)


def test_generate(benchmark, bench, request, arm, context):
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache as fp16_cache

    harness.skip_unless_measured(bench.device, SUITE, arm, bench.named_arms)
    harness.skip_unless_mlx_q_works(arm)
    sz = bench.sizes[SUITE]
    model, args = harness.model(sz["layers"], sz["shape"])
    prompts = [mx.random.randint(0, args.vocab_size, (context,), key=mx.random.key(i))
               for i in range(harness.POOL)]
    # the prompt but its last token in the cache, as generate_step leaves it before its first step
    fp16 = harness.shared(SUITE, (context, sz["layers"], sz["shape"]),
                          lambda: harness.prefill_model(model, prompts[0][:-1], fp16_cache(model)))
    from veloxquant.tools.bench import arms as bench_arms
    with bench_arms.knobs(arm):      # an arm's tuning knobs (--bench-arms "turboquant b4 [FUSE_COMBINE=1]")
        caches = {"fp16": fp16, "ours": harness.fill_from(harness.make_caches(arm, model, sz["layers"]), fp16)}

    def generate(name):
        def go(i):       # the generation continues from where the last round left the cache
            with bench_arms.knobs(arm if name == "ours" else "fp16"):
                for _ in generate_step(prompts[i][-1:], model, max_tokens=sz["tokens"], prompt_cache=caches[name]):
                    pass
        return go

    benchmark.group = f"generate_step, {sz['layers']}-layer llama ({sz['shape']}), {sz['tokens']} tokens per round " \
                      f"after {context}"
    try:
        res = harness.paired(benchmark, generate("ours"), {"fp16": generate("fp16")}, rounds=sz["rounds"],
                             warmup=sz["warmup"], info=dict(suite=SUITE, arm=arm, **harness.cache_settings(arm),
                                                            context=context, layers=sz["layers"], tokens=sz["tokens"],
                                                            shape=sz["shape"]))
    finally:
        for c in fp16:
            c.trim(c.offset - (context - 1))
    if "median_s" in res:
        benchmark.extra_info["tokens_per_s"] = sz["tokens"] / res["median_s"]
        benchmark.extra_info["fp16_tokens_per_s"] = sz["tokens"] / res["baseline_median_s"]["fp16"]
    bench.gate(request, SUITE, res)
