"""accelerated.cache at the head dims of spec 1.1 that are not powers of two, inside real mlx-lm models:
random llama models (mlx_lm.models.llama, 2 layers, 2 KV heads, float16) with head_dim 96 (Phi-3-mini,
GPT-NeoX-20B) and 80 (Phi-2, Pythia-2.8B) generate through every cache class, and save/load round-trips.

The caches need no head-dim code of their own: spec.Params.check_head_dim accepts d = m * 2^k and
accelerated.ops does the rest. Oracles: mlx-lm's own KVCache (layer 0 sees identical keys and values in
both runs, so its records must be the numpy reference's one-shot encode of them, bit for bit), the
fp16 logits (KL bound), and the same cache never saved (save/load continuation).
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models import cache as mlx_cache

import veloxquant.accelerated.cache as vc
from veloxquant import reference
from veloxquant.tools.quality import VOCAB, teacher_forced_logits, tiny_llama
from _mlx_lm_util import (KL_MEAN_BOUND, METHODS, PROMPT, as_bits, caches_for, next_token_kl, saved_and_loaded,
                          tokens)


@pytest.fixture(scope="module", params=[96, 80])
def model(request):
    return tiny_llama(request.param, seed=0)


@pytest.mark.parametrize("method", METHODS)
def test_generate_step(model, method):
    prompt = tokens(PROMPT, 1)
    caches = caches_for(model, method)
    ref = [mlx_cache.KVCache() for _ in model.layers]
    out = [(t, lp) for t, lp in generate_step(prompt, model, max_tokens=4, prompt_cache=caches, prefill_step_size=16)]
    list(generate_step(prompt, model, max_tokens=4, prompt_cache=ref, prefill_step_size=16))
    assert len(out) == 4 and all(0 <= t < VOCAB for t, _ in out)
    assert all(bool(mx.all(mx.isfinite(lp))) for _, lp in out)
    for layer, (c, r) in enumerate(zip(caches, ref)):
        assert type(c) is vc.CLASS_BY_METHOD[method] and c.key_params.layer == layer
        assert c.offset == r.offset and c.state[0]["window"].shape[3] == model.args.head_dim
        kept = sum(rec["kept"].nbytes for rec in c.state[:2] if "kept" in rec)   # streaming.md "Exact trims"
        assert c.nbytes - kept < 0.5 * sum(a.nbytes for a in r.keys_and_values())


@pytest.mark.parametrize("method", METHODS)
def test_layer0_records_are_the_reference_encode(model, method):
    """Teacher-forced, so layer 0 sees the same keys and values (they come from the embeddings alone) in
    the compressed and in mlx-lm's fp16 run: its records are the numpy reference's one-shot encode of them."""
    seq = tokens(PROMPT + 6, 4)
    caches = caches_for(model, method)
    ref = [mlx_cache.KVCache() for _ in model.layers]
    teacher_forced_logits(model, caches, seq, PROMPT)
    teacher_forced_logits(model, ref, seq, PROMPT)
    c = caches[0]
    k_rec, v_rec, _ = c.state
    rk, rv = (np.array(a) for a in ref[0].keys_and_values())
    assert rk.shape == (1, 2, PROMPT + 6, model.args.head_dim)
    for rec, x, params in ((k_rec, rk, c.key_params), (v_rec, rv, c.value_params)):
        want = reference.encode(x, params, "float16")
        rec = {k: v for k, v in rec.items() if k != "kept"}     # beside the record (streaming.md "Exact trims")
        assert list(rec) == list(want)
        for name in want:
            np.testing.assert_array_equal(as_bits(rec[name]), want[name].view(
                {1: np.uint8, 2: np.uint16, 4: np.uint32}[want[name].itemsize]), err_msg=f"{params.role} {name}")


@pytest.mark.parametrize("method", METHODS)
def test_next_token_kl_vs_fp16(model, method):
    kl = next_token_kl(model, method)
    assert 0 < kl.mean() < KL_MEAN_BOUND[method], (method, kl.mean())


@pytest.mark.parametrize("method", METHODS)
def test_save_load_round_trip(model, method, tmp_path):
    a, b, prompt = saved_and_loaded(model, method, str(tmp_path / "prompt.safetensors"))
    for x, y in zip(a[1].state[:2], b[1].state[:2]):       # identical bytes after load
        assert list(x) == list(y)
        for name in x:
            np.testing.assert_array_equal(as_bits(x[name]), as_bits(y[name]), err_msg=name)
    toks_a = [t for t, _ in generate_step(prompt[-1:], model, max_tokens=5, prompt_cache=a)]
    toks_b = [t for t, _ in generate_step(prompt[-1:], model, max_tokens=5, prompt_cache=b)]
    assert toks_a == toks_b
    for x, y in zip(a[1].state[:2], b[1].state[:2]):       # and both continued to the same bytes
        for name in x:
            np.testing.assert_array_equal(as_bits(x[name]), as_bits(y[name]), err_msg=name)


def test_kivi_values_need_a_group_size_dividing_d():
    """At d = 80 kivi's default G = 32 cannot group the values (methods/kivi.md): the first update is
    rejected naming the values and group_size, and the cache stays empty; keys alone work with G = 32."""
    c = vc.KIVIKVCache(bits=2, window=0)                    # default group_size 32
    k = mx.ones((1, 2, 3, 80), dtype=mx.float16)
    with pytest.raises(ValueError, match=r"^values: group_size: 32 does not divide head dim 80"):
        c.update_and_fetch(k, k)
    assert c.empty() and c.offset == 0
    mixed = vc.VeloxKVCache(key_method="kivi", value_method="turboquant", bits=4, group_size=32, window=0)
    kk, vv = mixed.update_and_fetch(k, k)
    assert kk.shape == vv.shape == (1, 2, 3, 80)
