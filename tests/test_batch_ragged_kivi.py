"""A ragged KIVI batch (rows' lengths differing mod G) in one B-row cache: accelerated/cache/ragged.py's per-row
group phase, behind tuning's `ragged` (off by default; docs/ragged-kivi.md). On a GPU, KIVI in both roles steps through
the fused decode step (VQ_RAGGED), the mixed pair (its window in both roles here) through the general path's append and
the ragged MIXED partial. KIVI in both roles and keys turboquant 3-bit beside values KIVI 2-bit, window 0 and 128.

Oracle: each sequence's own single-sequence cache, driven with the same tokens: record bytes and nbytes of every
row after merge (the prefill) and after each decode step (flushes in every row among them, each at its own step),
through filter, extend, save/load and a rolled-back bad chunk; attention outputs per row within the tier's float32
tolerance; mlx_lm.batch_generate's greedy tokens.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import batch_generate, generate_step
from mlx_lm.models import base

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import kernels
from veloxquant.accelerated.cache import ragged
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.cache.batch import BatchVeloxKVCache
from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
from veloxquant.accelerated.attention import RaggedStepKV
from veloxquant.accelerated.ops.attention import RaggedRecord, RowStarts
from veloxquant.tools.quality import VOCAB, tiny_llama
from _batch_util import D, H, attends_like_singles, filled_with, kv, record_bytes, saves_and_loads
from test_batch_shared import LOGPROB_ATOL, _Tok

G = 32
LENGTHS = {0: [37, 50, 64], 128: [37, 50 + 128, 64 + 128]}   # R = 128: one row still all window, two flushing
CONFIGS = [(m, w) for m in (False, True) for w in (0, 128)]
IDS = [f"{'tq3-kivi2' if m else 'kivi2'}-R{w}" for m, w in CONFIGS]


@pytest.fixture(autouse=True)
def _ragged(tune):
    tune(ragged=True)


def kivi(mixed: bool, window: int, g: int = G):
    if mixed:
        return vc.VeloxKVCache(key_method="turboquant", key_bits=3, value_method="kivi", value_bits=2, group_size=g,
                               seed=2, layer=1, window=window)
    return vc.KIVIKVCache(bits=2, group_size=g, seed=2, layer=1, window=window)


def _same_rows(batch, singles, when: str) -> None:
    assert isinstance(batch, SharedBatchVeloxKVCache) and batch._seq is None and ragged.is_ragged(batch.inner), \
        f"{when}: not one ragged B-row cache"
    assert batch.offset.tolist() == [c.offset for c in singles], when
    rows = [batch.extract(i) for i in range(len(singles))]
    for i, (r, c) in enumerate(zip(rows, singles)):
        assert record_bytes(r) == record_bytes(c), f"{when}: row {i}'s bytes differ from its own cache's"
        assert (r.nbytes, r.nbytes_parts) == (c.nbytes, c.nbytes_parts), f"{when}: row {i}"


def _step(batch, singles, k, v):
    batch.update_and_fetch(k, v)
    for i, c in enumerate(singles):
        c.update_and_fetch(k[i:i + 1], v[i:i + 1])


@pytest.mark.parametrize("mixed, window", CONFIGS, ids=IDS)
def test_a_ragged_kivi_batch_is_one_cache_with_each_sequences_bytes(mixed, window, tmp_path):
    """merge of rows whose lengths differ mod G gives one B-row cache (ragged streams); after the prefill and after
    each of G + 3 decode steps (every flushing row flushes a group, each at its own step) every row's record bytes
    are its own cache's; filter, extend and save/load keep them (one ragged cache again after each)."""
    lengths = LENGTHS[window]
    singles = filled_with(lambda: kivi(mixed, window), lengths, seed=7)
    batch = type(singles[0]).merge(filled_with(lambda: kivi(mixed, window), lengths, seed=7))
    _same_rows(batch, singles, "merge")
    flushes = set()
    before = batch.inner._v.bounds()
    for s in range(G + 3):
        _step(batch, singles, *kv(1, 300 + s, b=3))
        _same_rows(batch, singles, f"decode step {s}")
        # read after _same_rows: on a GPU the step's append waits for the attention launch (decode_step's pending
        # append) and the streams' host state follows only once something reads the rows
        after, lp = batch.inner._v.bounds(), batch.left_padding.tolist()
        # (a boundary moving inside a row's padding encodes nothing of it)
        flushes |= {i for i, (a, b) in enumerate(zip(before, after)) if b > max(a, lp[i])}
        before = after
    assert flushes == {i for i, n in enumerate(lengths) if n + G + 3 >= window + G}, flushes
    batch.filter([0, 2])
    singles = [singles[0], singles[2]]
    _same_rows(batch, singles, "filter")
    joining = filled_with(lambda: kivi(mixed, window), [window + 3], seed=20)
    batch.extend(type(joining[0]).merge(filled_with(lambda: kivi(mixed, window), [window + 3], seed=20)))
    singles += joining
    _same_rows(batch, singles, "extend")
    for s in range(3):
        _step(batch, singles, *kv(1, 400 + s, b=3))
    _same_rows(batch, singles, "decode after extend")
    saves_and_loads(batch, SharedBatchVeloxKVCache, str(tmp_path / "ragged.safetensors"),
                    [c.offset for c in singles], meta=False)


def test_without_the_knob_a_ragged_batch_goes_per_sequence(tune):
    tune(ragged=False)
    batch = vc.KIVIKVCache.merge(filled_with(lambda: kivi(False, 0), LENGTHS[0]))
    assert isinstance(batch, BatchVeloxKVCache), type(batch)


@pytest.mark.parametrize("mixed, window", CONFIGS, ids=IDS)
def test_a_ragged_kivi_batch_attends_each_row_as_its_own_cache(mixed, window):
    """Packed mode: each row's attention output is its single cache's within the tier's float32 tolerance through
    decode steps crossing every row's flush, with the rows' starts as the mask (RowStarts)."""
    lengths = LENGTHS[window]
    batch = type(kivi(mixed, window)).merge(filled_with(lambda: kivi(mixed, window), lengths, seed=5))
    singles = filled_with(lambda: kivi(mixed, window), lengths, seed=5)
    assert ragged.is_ragged(batch.inner)
    seen = attends_like_singles(batch, singles, G + 2)
    assert seen.count(RowStarts) == G + 2, seen


def test_a_bad_chunk_rolls_the_whole_ragged_batch_back():
    """Deferred checks: a NaN in one row's token raises at a later step with every row back before that chunk
    (its bytes), and the next good chunk goes on from there."""
    batch = vc.KIVIKVCache.merge(filled_with(lambda: kivi(False, 0), LENGTHS[0], seed=3))
    singles = filled_with(lambda: kivi(False, 0), LENGTHS[0], seed=3)
    for s in range(26):     # the 37-token row's window at 31 tokens: the next step flushes it
        _step(batch, singles, *kv(1, 500 + s, b=3))
    good = [record_bytes(batch.extract(i)) for i in range(3)]
    k, v = kv(1, 600, b=3)
    bad = mx.concatenate([k[:1], mx.full(k[1:2].shape, float("nan"), dtype=k.dtype), k[2:]])
    batch.update_and_fetch(bad, v)
    with pytest.raises(ValueError, match="keys"):
        for s in range(3):
            batch.update_and_fetch(*kv(1, 700 + s, b=3))
        batch.check()
    assert [record_bytes(batch.extract(i)) for i in range(3)] == good
    assert batch.offset.tolist() == [c.offset for c in singles]
    _step(batch, singles, *kv(1, 800, b=3))
    _same_rows(batch, singles, "after the rollback")


def test_batch_generate_with_ragged_prompts_gives_the_single_sequence_tokens():
    """mlx_lm.batch_generate through KIVI caches (G = 16, window 0) handed in as prompt caches: prompts of lengths
    differing mod G share one ragged B-row cache per layer, and each sequence's greedy tokens are its single run's
    (enough tokens for every row to flush a group)."""
    model = tiny_llama(64, seed=0)
    lengths = [5, 40, 23, 1]
    prompts = [mx.random.randint(0, VOCAB, (n,), key=mx.random.key(n)).tolist() for n in lengths]
    n_tokens = 20
    mk = lambda: vc.make_prompt_cache(model, method="kivi", bits=2, group_size=16, window=0)  # noqa: E731

    def single(p, c):
        out = list(generate_step(mx.array(p), model, max_tokens=n_tokens, prompt_cache=c))
        return [t for t, _ in out], [float(lp[t]) for t, lp in out]

    ref = [single(p, mk()) for p in prompts]
    kinds = []
    real = SharedBatchVeloxKVCache.update_and_fetch

    def spy(self, keys, values):
        kinds.append(self._seq is None and ragged.is_ragged(self.inner))
        return real(self, keys, values)
    SharedBatchVeloxKVCache.update_and_fetch = spy
    try:
        r = batch_generate(model, _Tok(), prompts, prompt_caches=[mk() for _ in prompts], max_tokens=n_tokens,
                           return_token_ids=True, return_logprobs=True)
    finally:
        SharedBatchVeloxKVCache.update_and_fetch = real
    assert kinds and any(kinds), "batch_generate never stepped a ragged B-row cache"
    assert r.token_ids == [t for t, _ in ref]
    np.testing.assert_allclose(np.array(r.logprobs), np.array([lp for _, lp in ref]), rtol=0, atol=LOGPROB_ATOL)


@pytest.mark.skipif(not kernels.available()[0], reason=f"needs the GPU kernels: {kernels.available()[1]}")
@pytest.mark.parametrize("mixed, window", CONFIGS, ids=IDS)
def test_gpu_a_ragged_kivi_batch_through_the_kernels(mixed, window, monkeypatch):
    """On a GPU: a ragged batch's steps leave each row its own cache's bytes and attend through the ragged partial
    (KIVI in both roles: the first step through kernels.attention, the next ones through the fused decode step with
    the append inside; the mixed pair: kernels.attention's ragged MIXED partial every step, the append on the general
    path) within the tolerance tier of each row's single cache."""
    lengths = LENGTHS[window]
    batch = type(kivi(mixed, window)).merge(filled_with(lambda: kivi(mixed, window), lengths, seed=5))
    singles = filled_with(lambda: kivi(mixed, window), lengths, seed=5)
    assert ragged.is_ragged(batch.inner)
    calls, steps, real = [], [], katt.attention

    def spy(q, k, v, *a, **kw):
        calls.append(isinstance(k, RaggedRecord))
        return real(q, k, v, *a, **kw)
    monkeypatch.setattr(katt, "attention", spy)
    for step in range(G + 2):
        q = mx.random.normal((3, 2 * H, 1, D), key=mx.random.key(70 + step)).astype(mx.float16)
        k, v = kv(1, 80 + step, b=3)
        mask = batch.make_mask(1)
        kk, vv = batch.update_and_fetch(k, v)
        n = len(calls)
        out = np.array(base.scaled_dot_product_attention(q, kk, vv, cache=batch, scale=D ** -0.5, mask=mask)
                       .astype(mx.float32))
        # the batch's step (not its singles'): the ragged partial called, or the ragged fused decode step's records
        steps.append(any(calls[n:]) or isinstance(kk, RaggedStepKV))
        for i, c in enumerate(singles):
            ks, vs = c.update_and_fetch(k[i:i + 1], v[i:i + 1])
            want = np.array(base.scaled_dot_product_attention(q[i:i + 1], ks, vs, cache=c, scale=D ** -0.5,
                                                              mask=None).astype(mx.float32))
            np.testing.assert_allclose(out[i:i + 1], want, rtol=0, atol=2e-3 * np.abs(want).max(),
                                       err_msg=f"row {i} step {step}")
    _same_rows(batch, singles, "after the steps")
    assert sum(steps) == G + 2, steps
