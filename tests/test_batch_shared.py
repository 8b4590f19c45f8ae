"""SharedBatchVeloxKVCache (accelerated/cache/batch_shared.py): a left-padded batch in one B-row cache.

Oracles: (1) mlx-lm 0.32's BatchKVCache driven through the same protocol calls (offset, left_padding, size, mask);
(2) the per-sequence BatchVeloxKVCache over the same caches (the values fetched in dequantize mode, which decode the
same bytes); (3) each sequence's single-sequence cache: record bytes after merge / extract / batched appends /
finalize (the methods encode token by token, so a sequence's bytes do not depend on the batch), logits within the
attention tier's tolerance, greedy tokens of mlx_lm.batch_generate; (4) float64 attention per row.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import batch_generate, generate_step
from mlx_lm.models import base
from mlx_lm.models import cache as mlx_cache

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import tuning
from veloxquant.accelerated.cache import masks, ragged
from veloxquant.accelerated.cache.batch import BatchVeloxKVCache
from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
from veloxquant.accelerated.ops.attention import RowStarts
from veloxquant.tools.quality import VOCAB, tiny_llama
from _batch_util import (D, H, appends_like_singles, attends_like_singles, filled_with, kv, masks_attended,
                         merged_after_a_chunk, saves_and_loads)
from _batch_util import record_bytes as _record_bytes

SETTINGS = {      # per-token methods, no window: what merge puts in one B-row cache
    "turboquant": dict(bits=4, window=0),
    "turboquant_rvq": dict(bits=2, window=0),
    "turboquant_prod": dict(bits=3, window=0),
    "rabitq": dict(bits=1, window=0),
    "mlx_affine": dict(bits=4, group_size=32, window=0),
}
# logits of a batch row against its single-sequence cache: the rows' splits differ (on a GPU), so float32 sums can
# differ in the last bits, and the tiny llama's logits are float16: two float16 rounding steps, far below what a
# wrong attention (a padding token attended) does to O(1) logits
LOGIT_RTOL, LOGIT_ATOL = 2.0 ** -9, 2.0 ** -12
# log-probabilities of generation: the tiny llama runs in float16, so they come out rounded to float16 (steps of
# 2^-8 .. 2^-7 at magnitudes 2-8): a last-bit difference in the logits can move one by up to two such steps
LOGPROB_ATOL = 2.0 ** -6
# where the batched and single flows already differ before a quantized layer (an fp16 first layer on a device whose
# batched matmuls round otherwise: fp16_gap > 0), that layer quantizes slightly different keys and values, and a
# code that flips moves the logits by O(2^-6) on the tiny llama; a wrong attention moves them O(1)
CODE_FLIP_ATOL = 2.0 ** -5


def cache(method, **kw):
    if method == "mlx_affine":
        return vc.VeloxKVCache(method="mlx_affine", seed=2, layer=1, **{**SETTINGS[method], **kw})
    return vc.CLASS_BY_METHOD[method](seed=2, layer=1, **{**SETTINGS[method], **kw})


def record_bytes(c) -> dict:
    return _record_bytes(c, meta=False)


def filled(method, lengths, seed=0, **kw):
    return filled_with(lambda: cache(method, **kw), lengths, seed)


G = 16      # KIVI's group in these tests


def kivi(mixed=False, **kw):
    """KIVI 2-bit in both roles, or (mixed) keys turboquant 3-bit and values KIVI 2-bit (the quality table's
    recommended pair)."""
    if mixed:
        return vc.VeloxKVCache(key_method="turboquant", key_bits=3, value_method="kivi", value_bits=2, group_size=G,
                               seed=2, layer=1, **{"window": 0, **kw})
    return vc.KIVIKVCache(bits=2, group_size=G, seed=2, layer=1, **{"window": 0, **kw})


def filled_kivi(lengths, seed=0, **kw):
    return filled_with(lambda: kivi(**kw), lengths, seed)


def test_merge_picks_the_shared_cache_where_the_methods_allow():
    assert isinstance(vc.TurboQuantKVCache.merge(filled("turboquant", [3, 0])), SharedBatchVeloxKVCache)
    # an exact window: one B-row cache too (each sequence's newest min(T, R) tokens exact, its older ones encoded)
    assert isinstance(vc.TurboQuantKVCache.merge(filled("turboquant", [3, 1], window=2)), SharedBatchVeloxKVCache)
    # ... but not with exact-trim copies (a per-sequence tail), nor where a trim left one window short of the other's
    assert isinstance(vc.TurboQuantKVCache.merge(filled("turboquant", [3, 1], window=2, exact_trim=2)),
                      BatchVeloxKVCache)
    trimmed = filled("turboquant", [9, 9], window=4)
    trimmed[0].trim(2)
    assert isinstance(vc.TurboQuantKVCache.merge(trimmed), BatchVeloxKVCache)
    # KIVI's position-dependent groups: one B-row cache where the left padding is whole groups (lengths equal mod
    # G); else, with tuning's ragged (on by default), one B-row cache of ragged rows (each its own group phase), and
    # without it a cache per sequence
    assert isinstance(vc.KIVIKVCache.merge(filled_kivi([37, 5])), SharedBatchVeloxKVCache)
    rag = vc.KIVIKVCache.merge(filled_kivi([37, 6]))
    assert isinstance(rag, SharedBatchVeloxKVCache) and ragged.is_ragged(rag.inner), rag
    with tuning.override(ragged=False):
        assert isinstance(vc.KIVIKVCache.merge(filled_kivi([37, 6])), BatchVeloxKVCache)
        assert isinstance(vc.KIVIKVCache.merge(filled_kivi([5, 6])), BatchVeloxKVCache)     # no group yet either
    assert isinstance(vc.KIVIKVCache.merge(filled_kivi([37, 5], exact_trim=4)), BatchVeloxKVCache)
    assert isinstance(vc.VeloxKVCache.merge(filled_kivi([40, 8], mixed=True)), SharedBatchVeloxKVCache)
    mixed = [cache("turboquant"), cache("turboquant", bits=3)]
    assert isinstance(vc.TurboQuantKVCache.merge([mixed[0], cache("turboquant")]), SharedBatchVeloxKVCache)
    with pytest.raises(ValueError, match="caches: item 1"):
        vc.TurboQuantKVCache.merge(mixed)          # BatchVeloxKVCache's message: other parameters
    with tuning.override(shared=False):
        assert isinstance(vc.TurboQuantKVCache.merge(filled("turboquant", [3, 0])), BatchVeloxKVCache)


@pytest.mark.parametrize("method", list(SETTINGS))
def test_merge_extract_and_batched_appends_keep_each_sequences_bytes(method):
    lengths = [37, 0, 5, 20]
    singles = filled(method, lengths)
    before = [record_bytes(c) for c in singles]
    batch = type(singles[0]).merge(singles)
    assert isinstance(batch, SharedBatchVeloxKVCache)
    assert batch.size() == 37 and batch.left_padding.tolist() == [0, 37, 32, 17]
    assert batch.offset.tolist() == lengths
    assert [record_bytes(batch.extract(i)) for i in range(4)] == before
    appends_like_singles(batch, singles, before, record_bytes)
    assert batch.left_padding.tolist() == [batch.size() - c.offset for c in singles]
    assert batch.nbytes >= sum(c.nbytes for c in singles)      # the padding rows are stored too


WINDOW = 8      # small enough that short sequences cross it within a test's decode steps


def _step_rows(batch, singles, k, v) -> None:
    """One batched chunk (every row real) into the batch, each row's slice into its single cache."""
    batch.update_and_fetch(k, v)
    for i, c in enumerate(singles):
        c.update_and_fetch(k[i:i + 1], v[i:i + 1])


def _same_rows(batch, singles, when: str) -> None:
    """Each row of the batch, extracted, is its single cache: offset, record bytes, nbytes (and its split)."""
    assert batch.offset.tolist() == [c.offset for c in singles], when
    rows = [batch.extract(i) for i in range(len(singles))]
    assert [record_bytes(r) for r in rows] == [record_bytes(c) for c in singles], when
    assert [(r.nbytes, r.nbytes_parts) for r in rows] == [(c.nbytes, c.nbytes_parts) for c in singles], when


@pytest.mark.parametrize("method", list(SETTINGS))
def test_a_windowed_batch_is_one_cache_with_each_sequences_bytes(method):
    """An exact window R > 0 (the newest R tokens of each sequence kept exact): merge makes one B-row cache, and
    through decode steps (short sequences crossing R among them), filter, extend (BatchGenerator's finished and
    joining sequences) and a right-padded prefill each row's record bytes and nbytes stay its single cache's."""
    singles = filled(method, [37, 0, 5, 20], window=WINDOW)
    batch = type(singles[0]).merge(singles)
    assert isinstance(batch, SharedBatchVeloxKVCache) and batch.inner.key_params.window == WINDOW
    _same_rows(batch, singles, "merge")
    for s in range(WINDOW + 4):       # rows of 0 and 5 tokens flush their oldest window tokens from here on
        _step_rows(batch, singles, *kv(1, 300 + s, b=4))
        _same_rows(batch, singles, f"decode step {s}")
    batch.filter([0, 2, 3])            # sequence 1 finished
    singles = [singles[i] for i in (0, 2, 3)]
    _same_rows(batch, singles, "filter")
    joining = filled(method, [3, 50], seed=20, window=WINDOW)
    batch.extend(type(joining[0]).merge(joining))
    singles += joining
    _same_rows(batch, singles, "extend")
    lengths = [4, 1, 9, 0, 6]             # a right-padded prefill chunk (BatchGenerator's prompt step)
    k, v = kv(9, 500, b=5)
    batch.prepare(lengths=lengths, right_padding=[9 - n for n in lengths])
    batch.update_and_fetch(k, v)
    batch.finalize()
    assert isinstance(batch.inner, type(singles[0]))        # one B-row cache again
    for i, n in enumerate(lengths):
        if n:
            singles[i].update_and_fetch(k[i:i + 1, :, :n], v[i:i + 1, :, :n])
    _same_rows(batch, singles, "right-padded prefill")
    for s in range(3):
        _step_rows(batch, singles, *kv(1, 600 + s, b=5))
    _same_rows(batch, singles, "decode after the prefill")
    assert batch.left_padding.tolist() == [batch.size() - c.offset for c in singles]


MAX_SIZE = 16      # a sliding window the sequences of a test pass


def rotating(method, **kw):
    return vc.VeloxRotatingKVCache(MAX_SIZE, method=method, seed=2, layer=1, **{**SETTINGS[method], **kw})


@pytest.mark.parametrize("method", list(SETTINGS))
def test_a_sliding_window_batch_is_one_cache_with_each_sequences_bytes(method):
    """Sliding-window caches (VeloxRotatingKVCache) holding different token counts (a prefill past max_size holds
    all its tokens until the next update evicts): merge makes one B-row cache, and through decode steps (each
    evicting), filter, extend and a right-padded prefill each row holds its single cache's tokens: offset, held
    tokens, record bytes, nbytes."""
    def same(batch, singles, when):
        _same_rows(batch, singles, when)
        assert [batch.extract(i)._held() for i in range(len(singles))] == [c._held() for c in singles], when

    singles = filled_with(lambda: rotating(method), [37, 0, 5, 20])
    batch = type(singles[0]).merge(singles)
    assert isinstance(batch, SharedBatchVeloxKVCache) and isinstance(batch.inner, vc.VeloxRotatingKVCache)
    same(batch, singles, "merge")
    for s in range(MAX_SIZE + 2):          # the short rows reach max_size too
        _step_rows(batch, singles, *kv(1, 300 + s, b=4))
        same(batch, singles, f"decode step {s}")
    batch.filter([0, 2, 3])
    singles = [singles[i] for i in (0, 2, 3)]
    same(batch, singles, "filter")
    joining = filled_with(lambda: rotating(method), [3, 50], seed=20)
    batch.extend(type(joining[0]).merge(joining))
    singles += joining
    same(batch, singles, "extend")
    lengths = [4, 1, 9, 0, 6]
    k, v = kv(9, 500, b=5)
    batch.prepare(lengths=lengths, right_padding=[9 - n for n in lengths])
    batch.update_and_fetch(k, v)
    batch.finalize()
    assert isinstance(batch.inner, vc.VeloxRotatingKVCache)
    for i, n in enumerate(lengths):
        if n:
            singles[i].update_and_fetch(k[i:i + 1, :, :n], v[i:i + 1, :, :n])
    same(batch, singles, "right-padded prefill")
    for s in range(3):
        _step_rows(batch, singles, *kv(1, 600 + s, b=5))
        same(batch, singles, f"decode after the prefill {s}")


def test_protocol_matches_mlx_lm_batch_kv_cache_and_the_per_sequence_cache():
    """The same protocol calls on ours (dequantize mode), mlx-lm's BatchKVCache (offsets, padding, size, mask) and
    the per-sequence BatchVeloxKVCache over the same caches (the fetched values at every position a real query
    sees: both decode the same bytes)."""
    exact = dict(attention="dequantize")
    lengths = [12, 3, 0]

    def three(lengths, seed):
        ours = vc.TurboQuantKVCache.merge(filled("turboquant", lengths, seed=seed, **exact))
        per_seq = BatchVeloxKVCache.merge(filled("turboquant", lengths, seed=seed, **exact))
        refs = []
        for i, t in enumerate(lengths):
            r = mlx_cache.KVCache()
            if t:
                r.update_and_fetch(*kv(t, seed + i))
            refs.append(r)
        return ours, per_seq, mlx_cache.KVCache.merge(refs)

    ours, per_seq, ref = three(lengths, 7)
    assert isinstance(ours, SharedBatchVeloxKVCache)
    _drive((ours, per_seq, ref), [
        ("update", (1, None)), ("update", (5, [5, 2, 4])), ("update", (1, None)), ("filter", [0, 2]),
        ("extend", three([2, 6], 50)), ("update", (1, None)), ("filter", [1, 2, 3]), ("update", (4, [1, 4, 2])),
        ("update", (1, None)), ("trim", 2), ("update", (1, None))])
    # a left-padded first chunk into an empty batch (BatchGenerator's prompts without history)
    _drive(three([0, 0, 0], 90), [("left", [2, 0, 4]), ("update", (5, None)), ("update", (1, None)),
                                   ("filter", [0, 2]), ("update", (1, None))])


def _drive(caches, ops):
    """The same protocol calls on (ours, per-sequence, mlx-lm's); after each, offsets, padding, size, masks, and the
    values fetched at every position some real query sees (ours against the per-sequence cache's)."""
    ours, per_seq, ref = caches
    for op, arg in ops:
        if op == "update":
            n, lens = arg
            b = ours.offset.shape[0]
            k, v = kv(n, 300 + ours.size(), b=b)
            if lens is not None:
                for c in caches:
                    c.prepare(lengths=lens, right_padding=[n - x for x in lens])
            mask = ours.make_mask(n, return_array=True)
            assert np.array_equal(np.array(mask), np.array(ref.make_mask(n, return_array=True))), op
            assert np.array_equal(np.array(mask), np.array(per_seq.make_mask(n, return_array=True))), op
            got, want = ours.update_and_fetch(k, v), per_seq.update_and_fetch(k, v)
            ref.update_and_fetch(k, v)
            real = [n] * b if lens is None else lens
            m = np.array(mask)
            keep = np.stack([m[i, 0, :r].any(axis=0) for i, r in enumerate(real)])
            assert keep.sum() > 0
            for a, w in zip(got, want):
                a, w = np.array(a).transpose(0, 2, 1, 3), np.array(w).transpose(0, 2, 1, 3)
                assert a.shape == w.shape
                np.testing.assert_array_equal(a[keep], w[keep])
            if lens is not None:
                for c in caches:
                    c.finalize()
        elif op == "left":
            for c in caches:
                c.prepare(left_padding=arg)
        elif op == "filter":
            for c in caches:
                c.filter(arg)
        elif op == "extend":
            for c, o in zip(caches, arg):
                c.extend(o)
        elif op == "trim":
            for c in caches:
                assert c.trim(arg) == arg
        assert ours.offset.tolist() == ref.offset.tolist() == per_seq.offset.tolist(), op
        assert ours.left_padding.tolist() == ref.left_padding.tolist(), op
        assert ours.size() == ref.size(), op


def test_a_decode_step_attends_each_row_from_its_start():
    """Packed mode: the mask the model gets from make_mask reaches our attention as the rows' starts (RowStarts),
    and each row's output equals float64 attention over that row's own tokens (decoded), within the tier."""
    from _attention_util import f64_attention
    batch = vc.TurboQuantKVCache.merge(filled("turboquant", [30, 9, 17], seed=5))
    with masks_attended() as seen:
        for step in range(3):
            q = mx.random.normal((3, 2 * H, 1, D), key=mx.random.key(70 + step)).astype(mx.float32)
            mask = batch.make_mask(1)
            kk, vv = batch.update_and_fetch(*kv(1, 80 + step, b=3))
            out = np.array(base.scaled_dot_product_attention(q, kk, vv, cache=batch, scale=D ** -0.5, mask=mask))
            kd = np.array(kk.record.dequantized()).astype(np.float64)     # float32 decode (the attention's)
            vd = np.array(vv.record.dequantized()).astype(np.float64)
            for i, s0 in enumerate(batch.left_padding.tolist()):
                want = f64_attention(np.array(q[i:i + 1]), kd[i:i + 1, :, s0:], vd[i:i + 1, :, s0:], D ** -0.5, False)
                np.testing.assert_allclose(out[i:i + 1], want, rtol=0, atol=1e-5, err_msg=f"row {i} step {step}")
    assert seen == [RowStarts] * 3, seen


@pytest.mark.parametrize("history, left_padding, mask_arrays", [
    ([60, 9, 37], None, 0),        # padding below the chunk: one SDPA per row over its own tokens
    ([0, 0, 0], None, 0),          # no padding (mlx-lm's right-padded prompts): one causal SDPA
    ([0, 0, 0], [0, 5, 20], 1),    # padding inside the chunk (queries with nothing to attend): the array mask
])
def test_a_prefill_chunk_attends_each_row_without_a_mask_array(monkeypatch, history, left_padding, mask_arrays):
    """A chunk of 40 queries (past the packed kernels' 32: the decoded path) over a B-row batch: SDPA gets no
    (B, 1, L, T) mask array where the rows' starts allow (MLX's unfused path materializes the scores), and each
    row's real queries match float64 causal attention over that row's own decoded tokens."""
    from _attention_util import f64_attention
    batch = vc.TurboQuantKVCache.merge(filled("turboquant", history, seed=8))
    if left_padding:
        batch.prepare(left_padding=left_padding)
    masks = []
    real_sdpa = mx.fast.scaled_dot_product_attention

    def sdpa(q, k, v, scale, mask=None, **kw):
        masks.append(type(mask))
        return real_sdpa(q, k, v, scale=scale, mask=mask, **kw)
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", sdpa)
    n = 40
    q = mx.random.normal((3, 2 * H, n, D), key=mx.random.key(71)).astype(mx.float16)
    mask = batch.make_mask(n)
    kk, vv = batch.update_and_fetch(*kv(n, 90, b=3))
    out = np.array(base.scaled_dot_product_attention(q, kk, vv, cache=batch, scale=D ** -0.5, mask=mask)
                   .astype(mx.float32))
    assert masks.count(mx.array) == mask_arrays, masks
    kd, vd = np.array(kk.dequantized().astype(mx.float32)), np.array(vv.dequantized().astype(mx.float32))
    t = kd.shape[2]
    for i, s0 in enumerate(batch.left_padding.tolist()):
        real = slice(max(0, s0 - (t - n)), n)           # the queries at or after the row's start
        want = f64_attention(np.array(q[i:i + 1, :, real].astype(mx.float32)), kd[i:i + 1, :, s0:],
                             vd[i:i + 1, :, s0:], D ** -0.5, True)
        np.testing.assert_allclose(out[i:i + 1, :, real], want, rtol=0, atol=2e-3 * np.abs(want).max(),
                                   err_msg=f"row {i}, start {s0}")


def _batched_and_single_logits(model, make_cache):
    """One forward over a merged batch of caches from `make_cache` (histories of different lengths, then a
    right-padded chunk, then decode steps) and each sequence's own cache through the same tokens: (batched logits
    per sequence, single logits per sequence, the batch caches, the single caches, the masks the steps attended)."""
    singles, batch, chunk, chunk_lengths, out = merged_after_a_chunk(model, make_cache)
    steps = [mx.random.randint(0, VOCAB, (3, 1), key=mx.random.key(10 + s)) for s in range(3)]
    with masks_attended() as masks:
        outs = [model(s, cache=batch) for s in steps]
    got, want = [], []
    for i, c in enumerate(singles):
        n = chunk_lengths[i]
        got.append([np.array(out[i, :n])] + [np.array(o[i]) for o in outs])
        want.append([np.array(model(chunk[i:i + 1, :n], cache=c)[0])] + [np.array(model(s[i:i + 1], cache=c)[0])
                                                                          for s in steps])
    return got, want, batch, singles, masks


def _gap(got, want) -> float:
    return max(float(np.abs(g - w).max()) for gs, ws in zip(got, want) for g, w in zip(gs, ws))


@pytest.mark.parametrize("method, fp16_layers", [("turboquant", (0, 0)), ("rabitq", (0, 0)), ("turboquant", (1, 0))])
def test_batched_forward_rows_match_single_sequence_logits(method, fp16_layers):
    """One forward over a merged batch (histories of different lengths, then a right-padded chunk, then decode
    steps): each sequence's real rows give its single-sequence cache's logits within LOGIT_RTOL / LOGIT_ATOL, plus
    the gap mlx-lm's own fp16 KVCache / BatchKVCache shows between batched and single logits of the same flow on
    this device (the model's batched and single matmuls: 0 on the CPU, float16 roundings on CUDA), and behind an
    fp16 first layer on such a device CODE_FLIP_ATOL. With an fp16 first layer, mlx-lm's BatchKVCache makes the
    mask and our layers attend with it as an array."""
    model = tiny_llama(64, seed=3)
    fp16_gap = _gap(*_batched_and_single_logits(model, lambda: mlx_cache.make_prompt_cache(model))[:2])
    got, want, batch, singles, masks = _batched_and_single_logits(
        model, lambda: vc.make_prompt_cache(model, method=method, fp16_layers=fp16_layers, **SETTINGS[method]))
    assert [isinstance(c, SharedBatchVeloxKVCache) for c in batch] == [not fp16_layers[0], True]
    # our layers get the rows' starts whichever cache made the mask (an fp16 first layer's BatchKVCache too)
    assert masks and set(masks) == {RowStarts}, masks
    flip = CODE_FLIP_ATOL if fp16_layers[0] and fp16_gap > 0 else 0.0
    for i, (gs, ws) in enumerate(zip(got, want)):
        for j, (g, w) in enumerate(zip(gs, ws)):
            np.testing.assert_allclose(g, w, rtol=LOGIT_RTOL, atol=LOGIT_ATOL + fp16_gap + flip,
                                       err_msg=f"sequence {i}, {'the chunk' if j == 0 else f'step {j}'} "
                                               f"(fp16 caches' batched-vs-single gap here: {fp16_gap:.3g})")
    # layer 0's keys and values depend on the tokens alone: the same bytes as the single caches'
    if not fp16_layers[0]:
        assert [record_bytes(batch[0].extract(i)) for i in range(3)] == [record_bytes(c[0]) for c in singles]


class _Tok:
    eos_token_ids: list = []

    def decode(self, tokens):
        return " ".join(map(str, tokens))


@pytest.mark.parametrize("method, window", [("turboquant", 0), ("turboquant_prod", 0), ("mlx_affine", 0),
                                            ("turboquant", WINDOW)])
def test_batch_generate_gives_the_single_sequence_tokens(method, window):
    """mlx_lm.batch_generate through our caches handed in as prompt caches (one B-row cache per layer): each
    sequence's greedy tokens equal its single-sequence run's, log-probabilities within LOGPROB_ATOL; the caches
    handed in stay as they were. With a window, prompts shorter and longer than it."""
    model = tiny_llama(64, seed=0)
    lengths = [5, 40, 23, 1]
    prompts = [mx.random.randint(0, VOCAB, (n,), key=mx.random.key(n)).tolist() for n in lengths]
    n_tokens = 6
    mk = lambda: vc.make_prompt_cache(model, method=method, **{**SETTINGS[method], "window": window})  # noqa: E731

    def single(p, c):
        out = list(generate_step(mx.array(p), model, max_tokens=n_tokens, prompt_cache=c))
        return [t for t, _ in out], [float(lp[t]) for t, lp in out]

    ref = [single(p, mk()) for p in prompts]
    given = [mk() for _ in prompts]
    kinds = []
    real = SharedBatchVeloxKVCache.merge.__func__

    def merge(cls, caches):
        kinds.append(cls)
        return real(cls, caches)
    SharedBatchVeloxKVCache.merge = classmethod(merge)
    try:
        r = batch_generate(model, _Tok(), prompts, prompt_caches=given, max_tokens=n_tokens, return_token_ids=True,
                           return_logprobs=True)
    finally:
        SharedBatchVeloxKVCache.merge = classmethod(real)
    assert kinds, "batch_generate did not merge into SharedBatchVeloxKVCache"
    assert r.token_ids == [t for t, _ in ref]
    np.testing.assert_allclose(np.array(r.logprobs), np.array([lp for _, lp in ref]), rtol=0, atol=LOGPROB_ATOL)
    assert all(c.empty() for caches in given for c in caches)


def test_a_bad_chunk_rolls_the_whole_batch_back():
    """Deferred checks: a NaN in one sequence's token raises at a later step, and the batch (its one B-row cache)
    is back where it was before that chunk; the next good chunk goes on from there."""
    batch = vc.TurboQuantKVCache.merge(filled("turboquant", [6, 2], seed=3))
    good = [record_bytes(batch.extract(i)) for i in range(2)]
    k, v = kv(1, 500, b=2)
    bad = mx.concatenate([k[:1], mx.full(k[1:].shape, float("nan"), dtype=k.dtype)])
    batch.update_and_fetch(bad, v)
    assert batch.offset.tolist() == [7, 3]         # read before the rollback: must not be kept after it
    with pytest.raises(ValueError, match="keys"):
        for s in range(3):
            batch.offset                    # as a model reads it (RoPE) before each update
            batch.update_and_fetch(*kv(1, 600 + s, b=2))
        batch.check()
    assert batch.size() == 6 and batch.offset.tolist() == [6, 2] and batch.left_padding.tolist() == [0, 4]
    assert [record_bytes(batch.extract(i)) for i in range(2)] == good
    batch.update_and_fetch(*kv(1, 700, b=2))
    assert batch.offset.tolist() == [7, 3]


def test_shared_batch_saves_and_loads(tmp_path):
    batch = vc.RaBitQKVCache.merge(filled("rabitq", [20, 3]))
    batch.update_and_fetch(*kv(1, 400, b=2))
    saves_and_loads(batch, SharedBatchVeloxKVCache, str(tmp_path / "batch.safetensors"), [21, 4], meta=False)


def test_windowed_and_sliding_window_batches_save_and_load(tmp_path):
    """A windowed batch and a sliding-window batch (rows holding different token counts right after merge) through
    save_prompt_cache / load_prompt_cache: each sequence's bytes, offsets and padding."""
    win = vc.TurboQuantKVCache.merge(filled("turboquant", [20, 3], window=WINDOW))
    win.update_and_fetch(*kv(1, 400, b=2))
    saves_and_loads(win, SharedBatchVeloxKVCache, str(tmp_path / "window.safetensors"), [21, 4], meta=False)
    singles = filled_with(lambda: rotating("turboquant"), [40, 30])
    singles[0].update_and_fetch(*kv(1, 401))             # evicts: holds max_size of its 41 tokens, the other all 30
    rot = vc.VeloxRotatingKVCache.merge(singles)
    assert rot._held == [MAX_SIZE, 30]
    saves_and_loads(rot, SharedBatchVeloxKVCache, str(tmp_path / "rotating.safetensors"), [41, 30], meta=False)
    assert [rot.extract(i)._held() for i in range(2)] == [c._held() for c in singles]


def test_the_layers_of_a_step_share_one_offsets_array():
    """The model reads `offset` in every layer (RoPE); the layers of a batch move in step, so one array per step and
    layout serves them all (not one host-made array per layer)."""
    layers = [vc.TurboQuantKVCache.merge(filled("turboquant", [5, 2], seed=s)) for s in (1, 2, 3)]
    assert len({id(c.offset) for c in layers}) == 1
    for c in layers:
        c.update_and_fetch(*kv(1, 9, b=2))
    offs = [c.offset for c in layers]
    assert len({id(o) for o in offs}) == 1 and offs[0].tolist() == [6, 3]
    layers[0].filter([1])
    assert layers[0].offset.tolist() == [3] and layers[1].offset.tolist() == [6, 3]


def test_remembered_prefill_masks_do_not_pile_up():
    """remember_mask keeps the last few masks (a step's layers look theirs up) but a big one (a prefill chunk's
    (B, 1, L, T), hundreds of MB at long contexts) only until the next: at most one is ever held."""
    import collections
    kept = collections.OrderedDict()
    small = [mx.zeros((2, 1, 1, 64), dtype=mx.bool_) for _ in range(3)]
    big = [mx.zeros((1, 1, 2048, 2 * masks.BIG_MASK // 2048), dtype=mx.bool_) for _ in range(2)]
    for m in (small[0], big[0], small[1], big[1], small[2]):
        masks.remember_mask(kept, m, (m,), 8)
        assert sum(v[0].size > masks.BIG_MASK for v in kept.values()) <= 1, list(kept)
    assert [id(v[0]) for v in kept.values()] == [id(m) for m in small], "small masks are kept, big ones dropped"


@pytest.mark.parametrize("rag", [False, True], ids=["per-sequence", "ragged"])
@pytest.mark.parametrize("mixed", [False, True], ids=["kivi", "tq3-kivi2"])
@pytest.mark.parametrize("window", [0, WINDOW])
def test_a_kivi_batch_whole_groups_apart_is_one_cache_with_each_sequences_bytes(window, mixed, rag, tune):
    """KIVI (both roles, or values beside turboquant keys) in one B-row cache where every row's left padding is a
    whole number of groups (lengths equal mod G: each row's groups and window flushes are the stream's): through
    decode steps (flushes among them), filter, an extend with rows not whole groups apart (with tuning's ragged off
    the batch goes on per sequence; on, the default, it stays one B-row cache of ragged rows) and a filter that
    leaves whole groups again (one B-row cache again), a ragged right-padded prefill, each row's record bytes and
    nbytes stay its single cache's."""
    tune(ragged=rag)

    def same(batch, singles, when, shared):
        _same_rows(batch, singles, when)
        shared = shared or rag
        assert (batch._seq is None) == shared, f"{when}: {'not ' if shared else ''}one B-row cache"

    singles = filled_kivi([37, 5, 21, 53], window=window, mixed=mixed)
    batch = type(singles[0]).merge(singles)
    assert isinstance(batch, SharedBatchVeloxKVCache) and batch.left_padding.tolist() == [16, 48, 32, 0]
    same(batch, singles, "merge", True)
    for s in range(G + 3):              # every row flushes a group (G steps), the short rows cross the window
        _step_rows(batch, singles, *kv(1, 300 + s, b=4))
        same(batch, singles, f"decode step {s}", True)
    batch.filter([0, 2, 3])
    singles = [singles[i] for i in (0, 2, 3)]
    same(batch, singles, "filter", True)
    joining = filled_kivi([3, 50], seed=20, window=window, mixed=mixed)
    batch.extend(type(joining[0]).merge(joining))
    singles += joining
    same(batch, singles, "extend with rows not whole groups apart", False)
    _step_rows(batch, singles, *kv(1, 400, b=5))
    same(batch, singles, "decode step per sequence", False)
    batch.filter([0, 1, 2])
    singles = singles[:3]
    same(batch, singles, "filter back to rows whole groups apart", True)
    lengths = [4, 4 + G, 4]              # a ragged right-padded prefill chunk that keeps them whole groups apart
    k, v = kv(4 + G, 500, b=3)
    batch.prepare(lengths=lengths, right_padding=[4 + G - n for n in lengths])
    batch.update_and_fetch(k, v)
    batch.finalize()
    for i, n in enumerate(lengths):
        singles[i].update_and_fetch(k[i:i + 1, :, :n], v[i:i + 1, :, :n])
    same(batch, singles, "right-padded prefill", True)
    for s in range(3):
        _step_rows(batch, singles, *kv(1, 600 + s, b=3))
    same(batch, singles, "decode after the prefill", True)
    assert batch.left_padding.tolist() == [batch.size() - c.offset for c in singles]


@pytest.mark.parametrize("mixed", [False, True], ids=["kivi", "tq3-kivi2"])
@pytest.mark.parametrize("window", [0, WINDOW])
def test_a_kivi_batch_attends_each_row_as_its_own_cache(window, mixed):
    """Packed mode: each row of a KIVI B-row batch (rows whole groups apart) gives its single cache's attention
    output within the tier's float32 tolerance, through decode steps that flush a group, with the rows' starts as
    the mask (RowStarts)."""
    lengths = [40, 8, 24]
    batch = type(kivi()).merge(filled_kivi(lengths, seed=5, window=window, mixed=mixed))
    singles = filled_kivi(lengths, seed=5, window=window, mixed=mixed)
    assert isinstance(batch, SharedBatchVeloxKVCache)
    seen = attends_like_singles(batch, singles, G + 2)
    assert seen.count(RowStarts) == G + 2, seen          # the batch's calls (the singles': None)
