"""Batched generation as mlx_lm.server batches: mlx_lm.batch_generate of B ragged prompts (lengths t, t - 17,
t - 34, ...: the batch pads), our caches handed in as prompt caches (merged by mlx-lm's BatchGenerator into our batch
cache) against mlx-lm's fp16 caches (merged into its BatchKVCache), timed in the same rounds; gated: ours / fp16 per
round (median) of the whole call's time. Also each arm's generation tokens/s of the whole batch as mlx-lm's
BatchStats counts it, and which attention path ran.

Each prompt but its last token is run through the model once per (t, B) into fp16 caches (untimed); each arm's
caches are filled with the keys and values the model wrote there. A round hands the prefilled caches to
batch_generate with each sequence's last token as its prompt (the round's input: the last token shifted by the
round's index) and generates `tokens` tokens per sequence: the call's time is the merge of the caches into one
batch cache, one prompt token and the generation. batch_generate does not change the caches it is given, so every
round starts from the same prefilled caches (checked after the rounds)."""
from __future__ import annotations

import statistics

import pytest

import harness

pytest.importorskip("mlx_lm")
SUITE = "batch_generate"
ARMS = [*harness.ALL_ARMS, *harness.MLX_Q]      # the `arm` parameters, with --bench-arms' and --bench-kv's (conftest.py)


def test_batch_generate(benchmark, bench, request, arm, batch_config):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache as fp16_cache

    from veloxquant.tools.bench import arms as bench_arms
    harness.skip_unless_measured(bench.device, SUITE, arm, bench.named_arms)
    sz = bench.sizes[SUITE]
    t, n_seq = batch_config
    model, args = harness.model(sz["layers"], sz["shape"])
    prompts = [mx.random.randint(0, args.vocab_size, (max(2, t - 17 * j),), key=mx.random.key(t + j))
               for j in range(n_seq)]
    fp16 = harness.shared(SUITE, (t, n_seq, sz["layers"], sz["shape"]),
                          lambda: [harness.prefill_model(model, p[:-1], fp16_cache(model)) for p in prompts])
    with bench_arms.knobs(arm):      # an arm's tuning knobs (--bench-arms "kivi b4 (window 128) [RAGGED=1]")
        ours = [harness.fill_from(harness.make_caches(arm, model, sz["layers"]), c) for c in fp16]
    offsets = [[c.offset for c in seq] for seq in (*fp16, *ours)]
    tps = {"ours": [], "fp16": []}
    paths = {}

    def run(key, caches):
        def go(i):
            last = [[(int(p[-1].item()) + i) % args.vocab_size] for p in prompts]
            with bench_arms.knobs(arm if key == "ours" else "fp16"):
                r, seen = bench_arms.batch_run(model, last, sz["tokens"], caches)
            tps[key].append(r.stats.generation_tps)
            if key == "ours":
                paths.update(seen)
        return go

    benchmark.group = f"batch_generate, {sz['layers']}-layer llama ({sz['shape']}), {n_seq} prompts of about {t} " \
                      f"tokens, {sz['tokens']} tokens each"
    res = harness.paired(benchmark, run("ours", ours), {"fp16": run("fp16", fp16)}, rounds=sz["rounds"],
                         warmup=sz["warmup"], info=dict(suite=SUITE, arm=arm, **harness.cache_settings(arm), context=t,
                                                        batch=n_seq,
                                                        layers=sz["layers"], tokens=sz["tokens"], shape=sz["shape"]))
    after = [[c.offset for c in seq] for seq in (*fp16, *ours)]
    assert after == offsets, "batch_generate changed the prompt caches it was given: the rounds would not be alike"
    w = sz["warmup"]
    gen = {k: v[w:] for k, v in tps.items()}
    benchmark.extra_info.update(
        generation_tokens_per_s=statistics.median(gen["ours"]), fp16_generation_tokens_per_s=statistics.median(
            gen["fp16"]), generation_time_ratio=statistics.median(f / o for o, f in zip(gen["ours"], gen["fp16"])),
        paths=paths)
    bench.gate(request, SUITE, res)
