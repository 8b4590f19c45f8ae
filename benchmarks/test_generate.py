"""End-to-end generation as a user runs it: mlx_lm.generate.generate_step on a small random llama, our caches
(make_prompt_cache) against mlx-lm's fp16 KVCache, timed in the same rounds; ours / fp16 per round (median) is
gated, a ratio of times per token (the inverse of the tokens/s ratio). Both caches are prefilled with the same prompt
once (untimed); each round then generates `tokens` more tokens in
each, continuing the same generation (so both caches grow alike over the rounds)."""
from __future__ import annotations

import pytest

import harness

pytest.importorskip("mlx_lm")


@pytest.mark.parametrize("arm", list(harness.ALL_ARMS))
def test_generate(benchmark, bench, request, arm):
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    import veloxquant.accelerated.cache as vc
    from veloxquant.tools.bench import arms as bench_arms
    harness.skip_unless_measured(bench.device, "generate", arm)
    sz = bench.sizes["generate"]
    model, args = bench_arms.model(sz["layers"], bench_arms.SHAPES[sz["shape"]])
    prompts = [mx.random.randint(0, args.vocab_size, (sz["context"],), key=mx.random.key(i))
               for i in range(harness.POOL)]

    def prefilled(cache):
        for _ in generate_step(prompts[0], model, max_tokens=0, prompt_cache=cache):
            pass
        mx.eval([c.state for c in cache])
        return cache

    from mlx_lm.models.cache import make_prompt_cache as fp16_cache
    caches = {"fp16": prefilled(fp16_cache(model)),
              "ours": prefilled(vc.make_prompt_cache(model, seed=1, **harness.ALL_ARMS[arm]))}

    def generate(name):
        def go(i):       # the generation continues from where the last round left the cache
            for _ in generate_step(prompts[i][-1:], model, max_tokens=sz["tokens"], prompt_cache=caches[name]):
                pass
        return go

    benchmark.group = f"generate_step, {sz['layers']}-layer llama ({sz['shape']}), {sz['tokens']} tokens per round " \
                      f"after {sz['context']}"
    res = harness.paired(benchmark, generate("ours"), {"fp16": generate("fp16")}, rounds=sz["rounds"],
                         warmup=sz["warmup"], info=dict(suite="generate", arm=arm, context=sz["context"],
                                                        layers=sz["layers"], tokens=sz["tokens"], shape=sz["shape"]))
    if "median_s" in res:
        benchmark.extra_info["tokens_per_s"] = sz["tokens"] / res["median_s"]
        benchmark.extra_info["fp16_tokens_per_s"] = sz["tokens"] / res["baseline_median_s"]["fp16"]
    bench.gate(request, "generate", res)
