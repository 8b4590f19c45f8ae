"""accelerated.cache inside real mlx-lm models: small random llama models (mlx_lm.models.llama, 2 layers,
head dim 64 and 128, 2 KV heads, float16) run through mlx_lm.generate.generate_step and direct calls.

Oracles: mlx-lm's own KVCache (offsets, token counts, fp16 bytes, reference logits) and the same cache
object that was never saved (save/load continuation).
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models import cache as mlx_cache

import veloxquant.accelerated.cache as vc
from veloxquant.tools.quality import VOCAB, kl_divergence, tiny_llama
from _mlx_lm_util import (KL_MEAN_BOUND, METHODS, PROMPT, as_bits, caches_for, next_token_kl, saved_and_loaded,
                          tokens)

HEAD_DIMS = [64, 128]


@pytest.fixture(scope="module", params=HEAD_DIMS)
def model(request):
    return tiny_llama(request.param, seed=0)


def run_generate(model, prompt, caches, n, **kw):
    out = [(tok, lp) for tok, lp in generate_step(prompt, model, max_tokens=n, prompt_cache=caches, **kw)]
    return [t for t, _ in out], [lp for _, lp in out]


@pytest.mark.parametrize("method", METHODS)
def test_generate_step(model, method):
    prompt = tokens(PROMPT, 1)
    caches = caches_for(model, method)
    ref = [mlx_cache.KVCache() for _ in model.layers]
    # prefill in chunks of 16 (generate_step's prefill loop evaluates every cache's `state` in between)
    toks, lps = run_generate(model, prompt, caches, 4, prefill_step_size=16)
    run_generate(model, prompt, ref, 4, prefill_step_size=16)
    assert len(toks) == 4 and all(0 <= t < VOCAB for t in toks)
    assert all(lp.shape == (VOCAB,) and bool(mx.all(mx.isfinite(lp))) for lp in lps)
    for layer, (c, r) in enumerate(zip(caches, ref)):
        assert type(c) is vc.CLASS_BY_METHOD[method] and c.key_params.layer == layer
        assert c.offset == r.offset == c.size() and not c.empty()
        k_rec, v_rec, _ = c.state
        rk, rv = r.keys_and_values()
        assert k_rec["window"].shape[:2] == rk.shape[:2] and k_rec["window"].shape[3] == rk.shape[3]
        fp16 = rk.nbytes + rv.nbytes                  # the same tokens in mlx-lm's float16 cache
        # the records; the kept tokens (spec/streaming.md "Exact trims", at most C per stream) are a
        # constant beside them, large only at these short contexts
        kept = sum(rec["kept"].nbytes for rec in (k_rec, v_rec) if "kept" in rec)
        assert c.nbytes - kept < 0.5 * fp16, (c.nbytes, kept, fp16)


@pytest.mark.parametrize("method", METHODS)
def test_next_token_kl_vs_fp16(model, method):
    kl = next_token_kl(model, method)
    assert kl.mean() > 0, "the compressed cache changed nothing: is it being used?"
    assert kl.mean() < KL_MEAN_BOUND[method], (method, kl.mean())


@pytest.mark.parametrize("method", METHODS)
def test_saved_cache_continues_identically(model, method, tmp_path):
    # The first layer stays a plain KVCache: the file mixes mlx-lm's class and ours.
    a, b, prompt = saved_and_loaded(model, method, str(tmp_path / "prompt.safetensors"))
    assert type(a[0]) is mlx_cache.KVCache and type(a[1]) is vc.CLASS_BY_METHOD[method]
    assert b[1].nbytes == a[1].nbytes and b[1].offset == a[1].offset == PROMPT - 1
    toks_a, lps_a = run_generate(model, prompt[-1:], a, 6)
    toks_b, lps_b = run_generate(model, prompt[-1:], b, 6)
    assert toks_a == toks_b
    for x, y in zip(lps_a, lps_b):
        np.testing.assert_array_equal(as_bits(x), as_bits(y))
    for x, y in zip(a[1].state[:2], b[1].state[:2]):   # and both continued to the same bytes
        assert list(x) == list(y)
        for name in x:
            np.testing.assert_array_equal(as_bits(x[name]), as_bits(y[name]), err_msg=name)


def test_kl_divergence_definition():
    # p = softmax([0, ln 3]) = (1/4, 3/4), q = uniform: KL = 1/4 ln(1/2) + 3/4 ln(3/2)
    ref = np.array([[0.0, np.log(3.0)]])
    want = 0.25 * np.log(0.5) + 0.75 * np.log(1.5)
    np.testing.assert_allclose(kl_divergence(ref, np.array([[5.0, 5.0]])), [want], rtol=1e-12)
    assert kl_divergence(ref, ref + 7.0)[0] == pytest.approx(0.0, abs=1e-15)
