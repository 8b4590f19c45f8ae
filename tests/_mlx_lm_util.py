"""Helpers of the tests of our caches inside random mlx-lm llama models (tests/test_mlx_lm_integration.py at head
dims 64 and 128, tests/test_mlx_lm_head_dims.py at 80 and 96): the methods' settings, the KL bounds, tokens, the
caches, bit views, the next-token KL against mlx-lm's fp16 KVCache and a save / load round trip."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models import cache as mlx_cache

import veloxquant.accelerated.cache as vc
from veloxquant.tools.quality import VOCAB, kl_divergence, teacher_forced_logits

# kivi values need G to divide d (methods/kivi.md): G = 16 divides 64, 80, 96 and 128.
SETTINGS = {
    "turboquant": dict(bits=4),
    "turboquant_rvq": dict(bits=2),
    "turboquant_prod": dict(bits=3),
    "kivi": dict(bits=2, group_size=16, window=0),
    "rabitq": dict(bits=1),
}
# Loose upper bounds on the mean next-token KL (nats) vs the fp16 KVCache on these random models, about
# 4-7x the values measured at d = 64 and 128 (see docs/quality.md); the quantizers' per-coordinate error does not
# depend on d, so they hold at 80 and 96 too. A broken cache (zeroed keys, random values, or swapped heads, i.e. a
# wrong head_offset) measures about 0.8-0.9 here, above every bound.
KL_MEAN_BOUND = {
    "turboquant": 0.05,       # 4 bits: measured ~0.007-0.009
    "turboquant_rvq": 0.1,    # 2 + 2 bits: ~0.02
    "turboquant_prod": 0.15,  # 2 + 1 bits: ~0.03-0.04
    "kivi": 0.3,              # 2 bits, G = 16: ~0.07
    "rabitq": 0.6,            # 1 bit: ~0.25-0.33
}
METHODS = list(SETTINGS)
PROMPT = 40


def tokens(n, seed):
    return mx.random.randint(0, VOCAB, (n,), key=mx.random.key(seed))


def as_bits(a) -> np.ndarray:
    a = mx.array(a) if not isinstance(a, mx.array) else a
    return np.array(a.view({1: mx.uint8, 2: mx.uint16, 4: mx.uint32}[a.itemsize]))


def caches_for(model, method, **kw):
    return vc.make_prompt_cache(model, method=method, seed=5, **{**SETTINGS[method], **kw})


def next_token_kl(model, method) -> np.ndarray:
    """Per-position KL of the next-token distribution with `method`'s caches against mlx-lm's fp16 KVCache,
    teacher-forced over PROMPT + 12 tokens (finite, or the assertion says so)."""
    seq = tokens(PROMPT + 12, 2)
    ref = teacher_forced_logits(model, [mlx_cache.KVCache() for _ in model.layers], seq, PROMPT)
    got = teacher_forced_logits(model, caches_for(model, method), seq, PROMPT)
    kl = kl_divergence(np.array(ref), np.array(got))
    assert np.all(np.isfinite(kl))
    return kl


def saved_and_loaded(model, method, path: str):
    """`method`'s caches behind a plain KVCache first layer, prefilled with PROMPT - 1 tokens, saved to `path` and
    loaded back (the same classes, or the assertion says so): (the caches, the loaded caches, the prompt)."""
    a = caches_for(model, method, fp16_layers=(1, 0))
    prompt = tokens(PROMPT, 3)
    mx.eval(model(prompt[None, :-1], cache=a))
    mlx_cache.save_prompt_cache(path, a)
    b = mlx_cache.load_prompt_cache(path)
    assert [type(c) for c in b] == [type(c) for c in a]
    return a, b, prompt
