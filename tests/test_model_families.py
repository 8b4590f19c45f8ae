"""Packed attention in the mlx-lm model families the issue names, with their code unchanged: tiny random
llama (also what mlx-lm runs for model_type "mistral"), qwen2, qwen3, gemma, gemma3_text (global layers
with our cache; its sliding layers with VeloxRotatingKVCache in tests/test_rotating_cache.py) and gemma2 (soft-capped logits computed
by the model itself: our cache falls back to returning decoded keys/values). For each: which attention
mode make_prompt_cache chose, that decode steps went through accelerated.attention's packed path, and that
greedy tokens equal the dequantizing cache's while the top-2 logit margin exceeds the tolerance."""
from __future__ import annotations

import importlib

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models import cache as mlx_cache

import veloxquant.accelerated.cache as vc
from _attention_util import paths_taken

VOCAB = 256
COMMON = dict(hidden_size=128, num_hidden_layers=2, intermediate_size=256, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB)
FAMILIES = {
    "llama": dict(head_dim=64),
    "qwen2": dict(),
    "qwen3": dict(head_dim=64, max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=10000.0),
    "gemma": dict(head_dim=64),
    "gemma3_text": dict(head_dim=64, num_hidden_layers=3, sliding_window=16, sliding_window_pattern=3,
                        query_pre_attn_scalar=64),
    "gemma2": dict(head_dim=64, query_pre_attn_scalar=64),
}
PACKED = {"llama", "qwen2", "qwen3", "gemma", "gemma3_text"}
TOP2_MARGIN = 0.05        # as tests/test_attention_packed.py


def _model(family: str):
    mod = importlib.import_module(f"mlx_lm.models.{family}")
    args = mod.ModelArgs(model_type=family, **{**COMMON, **FAMILIES[family]})
    mx.random.seed(1)
    model = mod.Model(args)
    model.set_dtype(mx.float16)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_attends_over_packed_records(family):
    model = _model(family)
    prompt = mx.random.randint(0, VOCAB, (60,), key=mx.random.key(4))
    caches = vc.make_prompt_cache(model, method="turboquant", bits=4, seed=3)
    ours = [c for c in caches if isinstance(c, vc.VeloxKVCache)]
    assert ours, "no layer got a VeloxQuant cache"
    assert {c.attention for c in ours} == {"packed" if family in PACKED else "dequantize"}
    if family == "gemma3_text":
        # sliding layers get compressed rotating caches (rotating.py) ...
        assert sum(isinstance(c, vc.VeloxRotatingKVCache) for c in caches) == 2
        # ... but here they keep mlx-lm's: in float16 this random gemma3 moves logits by up to ~0.2-0.3
        # between packed and decoded attention once its first layers are compressed (also with every layer
        # global), beyond TOP2_MARGIN; tests/test_rotating_cache.py compares those in float32 instead.
        caches = vc.make_prompt_cache(model, method="turboquant", bits=4, seed=3, compress_sliding=False)
        ours = [c for c in caches if isinstance(c, vc.VeloxKVCache)]
        assert any(isinstance(c, mlx_cache.RotatingKVCache) for c in caches)
    with paths_taken() as seen:
        packed = [(t, lp) for t, lp in generate_step(prompt, model, max_tokens=12, prompt_cache=caches)]
    if family in PACKED:
        assert seen.count("decoded") == len(ours) and len(seen) > len(ours)   # prompt decoded; steps packed
    else:
        assert not seen
    ref_caches = vc.make_prompt_cache(model, method="turboquant", bits=4, seed=3, attention="dequantize",
                                      compress_sliding=family != "gemma3_text")
    ref = [(t, lp) for t, lp in generate_step(prompt, model, max_tokens=12, prompt_cache=ref_caches)]
    for i, ((a, lpa), (b, _)) in enumerate(zip(ref, packed)):
        top2 = np.sort(np.array(lpa.astype(mx.float32)))[-2:]
        if top2[1] - top2[0] < TOP2_MARGIN:
            break
        assert a == b, f"{family}: token {i} differs with a top-2 margin of {top2[1] - top2[0]:.3f}"
