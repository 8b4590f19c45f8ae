"""Attention over packed records through the caches and mlx-lm (spec/attention.md, spec/streaming.md
'Deferred rejection'), on whatever device runs the tests: the MLX ops path on the CPU, the fused kernels on
a GPU (tests/test_attention_kernels_emulated.py checks the kernel bodies on the CPU).

- kernels vs the ops path vs float64 over the decoded records, long contexts (many splits), every method;
- greedy generation through packed attention equals decode-then-SDPA while the top-2 logit margin exceeds
  the tolerance (random llama, every method);
- the decode step makes no host synchronisation: a NaN chunk is accepted by its own append (no check ran)
  and rejected, with the rollback of every layer, by the second append after it;
- the fault flags of one append: one launch on a GPU, the same flags as the ops evaluation.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models import cache as mlx_cache

import veloxquant.accelerated.cache as vc
from veloxquant import spec
from veloxquant.accelerated import kernels
from veloxquant.accelerated.kernels import faults
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.ops import attention as oatt
from veloxquant.accelerated.ops import numerics
from veloxquant.tools.quality import VOCAB, tiny_llama

from _attention_util import f64_attention, packed, paths_taken

GPU, WHY = kernels.available()
SETTINGS = {
    "turboquant": dict(bits=4),
    "turboquant_rvq": dict(bits=2, bits2=2),
    "turboquant_prod": dict(bits=4),
    "kivi": dict(bits=4, group_size=32),
    "rabitq": dict(bits=1),
    "mlx_affine": dict(bits=4, group_size=64),
}
# Greedy tokens may differ once the best two logits are closer than the attention's error can move them:
# float32 attention differences (~1e-6 relative) through 2 layers and the fp16 model move logits by far
# less than 0.05 on these models (measured margins of divergence were all below 0.01).
TOP2_MARGIN = 0.05


_packed, _f64 = packed, f64_attention


@pytest.mark.skipif(not GPU, reason=f"fused kernels unavailable: {WHY}")
@pytest.mark.parametrize("method", list(SETTINGS))
@pytest.mark.parametrize("t, lq, window", [(1000, 1, 0), (5000, 3, 16), (300, 32, 0)])
def test_kernels_match_ops_and_float64(method, t, lq, window):
    rng = np.random.default_rng(t + lq)
    kw = SETTINGS[method]
    kp = spec.Params(method, role="k", window=window, seed=4, layer=7, head_offset=2, **kw).resolved()
    vp = spec.Params(method, role="v", window=window, seed=4, layer=7, head_offset=2, **kw).resolved()
    b, h, rep, d = 2, 4, 4, 128
    k = _packed(mx.array(rng.standard_normal((b, h, t, d)).astype(np.float16)), kp)
    v = _packed(mx.array(rng.standard_normal((b, h, t, d)).astype(np.float16)), vp)
    q = mx.array(rng.standard_normal((b, h * rep, lq, d)).astype(np.float16))
    mask = "causal" if lq > 1 else None
    assert katt.supports(q, k, v, mask)
    got = np.array(katt.attention(q, k, v, 0.088, mask).astype(mx.float32))
    want = _f64(np.array(q.astype(mx.float32)), np.array(k.dequantized()), np.array(v.dequantized()), 0.088,
                lq > 1)
    ops_out = np.array(oatt.attention(q, k, v, 0.088, mask).astype(mx.float32))
    tol = 2e-3 * np.abs(want).max()    # the float16 output's rounding; float32 attention errors are far below
    np.testing.assert_allclose(got, want, atol=tol, rtol=0)
    np.testing.assert_allclose(got, ops_out, atol=2 * tol, rtol=0)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(64, seed=3)


@pytest.mark.parametrize("method", list(SETTINGS))
def test_greedy_tokens_packed_equal_decoded(model, method):
    prompt = mx.random.randint(0, VOCAB, (120,), key=mx.random.key(11))
    runs = {}
    for mode in ("dequantize", "packed"):
        caches = vc.make_prompt_cache(model, method=method, seed=2, attention=mode, **SETTINGS[method])
        runs[mode] = [(t, lp) for t, lp in generate_step(prompt, model, max_tokens=24, prompt_cache=caches)]
    for i, ((a, lpa), (b_, _)) in enumerate(zip(runs["dequantize"], runs["packed"])):
        top2 = np.sort(np.array(lpa.astype(mx.float32)))[-2:]
        if top2[1] - top2[0] < TOP2_MARGIN:
            break                       # a near tie: the two paths may legitimately choose differently
        assert a == b_, f"{method}: token {i} differs ({a} vs {b_}) with a top-2 margin of {top2[1] - top2[0]:.3f}"


def test_decode_step_has_no_host_sync(model):
    """A NaN chunk passes its own append (nothing was evaluated to check it) and is rejected two appends
    later by the first layer, which rolls every layer (an fp16 boundary layer too) back to before it."""
    caches = vc.make_prompt_cache(model, method="turboquant", bits=4, fp16_layers=(1, 0))
    h = model.layers[0].self_attn.n_kv_heads
    d = model.args.head_dim
    good = lambda s: mx.random.normal((1, h, 1, d), key=mx.random.key(s)).astype(mx.float16)
    for s in range(3):
        for c in caches:
            c.update_and_fetch(good(s), good(s + 50))
    mx.eval([c.state for c in caches])
    offsets = [c.offset for c in caches]
    bad = mx.full((1, h, 1, d), float("nan"), dtype=mx.float16)
    for c in caches:
        c.update_and_fetch(good(5), bad)            # no error: the check is only recorded
    for c in caches:
        c.update_and_fetch(good(6), good(7))        # the bad chunk's flags are the newest but one: not yet
    with pytest.raises(ValueError, match=r"values: x: contains NaN or Inf \(chunk"):
        caches[1].update_and_fetch(good(8), good(9))
    assert [c.offset for c in caches] == offsets
    for c in caches[1:]:
        c.check()                                   # nothing left pending


def test_fault_flags_one_launch_equal_ops():
    x = mx.random.normal((2, 3, 5, 64)).astype(mx.float16)
    bad = mx.concatenate([x[:, :, :4], mx.full((2, 3, 1, 64), float("inf"), mx.float16)], axis=2)
    n = mx.array([[1.0, float("inf")], [2.0, 3.0]])
    pending = [("nonfinite", x, "a"), ("nonfinite", bad.swapaxes(1, 2), "b"), ("nonfinite", n, "c"),
               ("flag", mx.array([0, 0, 1], dtype=mx.uint32), "d"), ("flag", mx.zeros((4,), mx.bool_), "e")]
    got = np.array(faults.flags(pending)).astype(bool).tolist()
    assert got == [False, True, True, True, False]
    assert got == np.array(numerics.fault_flags(pending)).tolist()
    assert numerics.first_fault(pending, faults.flags(pending)) == "b"


def test_packed_path_is_taken(model):
    """mlx-lm's llama attention reaches accelerated.attention for packed caches (kernels on a GPU, the ops
    path on the CPU), and the decoded path only for the prompt."""
    with paths_taken() as seen:
        caches = vc.make_prompt_cache(model, method="turboquant", bits=4)
        list(generate_step(mx.arange(40) % VOCAB, model, max_tokens=6, prompt_cache=caches))
    n_layers = len(model.layers)
    assert seen[:n_layers] == ["decoded"] * n_layers           # the 40-token prompt
    assert set(seen[n_layers:]) == {"kernels" if GPU else "ops"}
    assert all(isinstance(c, vc.VeloxKVCache) and c.attention == "packed" for c in caches)
    assert not isinstance(caches[0], mlx_cache.KVCache)


@pytest.mark.parametrize("bits", [3, 5, 6, 7])
@pytest.mark.parametrize("d", [128, 80, 20])
def test_lookup_of_chunked_codes_equals_unpack(bits, d, monkeypatch):
    """Codes that do not tile bytes (3, 5, 6, 7 bits) are looked up a chunk of c codes at a time
    (accelerated/ops/attention.py _lookup): the same values, in the same places, as unpacking every code
    (accelerated.ops.packing) and gathering it. A distinct value per code, so a swapped chunk or code shows."""
    from veloxquant.accelerated.ops import packing
    table = mx.arange(1 << bits, dtype=mx.float32) * 0.25 - 3.0
    monkeypatch.setattr(oatt, "_table", lambda kind, b, dd, s1=0: table)
    oatt._chunk_lut.cache_clear()
    try:
        codes = np.random.default_rng(bits * d).integers(0, 1 << bits, size=(2, 3, 9, d)).astype(np.uint32)
        words = packing.pack(mx.array(codes), bits)
        got = oatt._lookup(words, "gaussian", bits, d)
        want = mx.take(table, packing.unpack(words, bits, d))
        assert got.shape == want.shape == (2, 3, 9, d)
        assert mx.array_equal(got, want).item(), f"_lookup(bits={bits}, d={d}): chunked values differ from unpack"
    finally:
        oatt._chunk_lut.cache_clear()
