"""Batched caches (accelerated/cache/batch.py) against mlx-lm 0.32's own BatchKVCache and single-sequence runs.

Oracles: (1) mlx-lm's BatchKVCache driven through the same protocol calls (offset, left_padding, size,
make_mask, and the fetched keys/values at unmasked positions, with a window large enough that our cache holds
every token exactly); (2) each sequence's single-sequence cache: record bytes after merge/extract and after
batched appends, attention outputs, and greedy tokens / log-probabilities / final caches of
mlx_lm.batch_generate, on random tiny llama models with head dim 64 and 128.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import batch_generate, generate_step
from mlx_lm.models import cache as mlx_cache

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated.cache.batch import BatchVeloxKVCache
from veloxquant.tools.quality import VOCAB, tiny_llama
from _batch_util import (D, H, appends_like_singles, filled_with, kv, merged_after_a_chunk, record_bytes,
                         saves_and_loads)

SETTINGS = {
    "turboquant": dict(bits=4, window=4),
    "turboquant_rvq": dict(bits=2),
    "turboquant_prod": dict(bits=3, window=2),
    "kivi": dict(bits=2, group_size=16, window=3),
    "rabitq": dict(bits=1),
    "mixed": dict(key_method="kivi", key_bits=4, group_size=16, value_method="turboquant", value_bits=3),
}


@pytest.fixture(autouse=True)
def per_sequence(monkeypatch, tune):
    """These tests are BatchVeloxKVCache's (a cache per sequence); tests/test_batch_shared.py covers the B-row
    SharedBatchVeloxKVCache that merge makes for per-token methods without a window."""
    tune(shared=False)


def cache(method, **kw):
    if method == "mixed":
        return vc.VeloxKVCache(seed=2, layer=1, **{**SETTINGS[method], **kw})
    return vc.CLASS_BY_METHOD[method](seed=2, layer=1, **{**SETTINGS[method], **kw})


def filled(method, lengths, seed=0, **kw):
    return filled_with(lambda: cache(method, **kw), lengths, seed)


@pytest.mark.parametrize("method", list(SETTINGS))
def test_merge_extract_and_batched_appends_keep_each_sequences_bytes(method):
    lengths = [37, 0, 5, 20]
    singles = filled(method, lengths)
    before = [record_bytes(c) for c in singles]
    batch = vc.VeloxKVCache.merge(singles) if method == "mixed" else type(singles[0]).merge(singles)
    assert isinstance(batch, BatchVeloxKVCache)
    assert batch.size() == 37 and batch.left_padding.tolist() == [0, 37, 32, 17]
    assert batch.offset.tolist() == lengths
    assert [record_bytes(batch.extract(i)) for i in range(4)] == before
    appends_like_singles(batch, singles, before, record_bytes)
    assert batch.nbytes == sum(c.nbytes for c in singles)


def _drive(ours, ref, ops):
    """Apply the same protocol calls to our batch cache (dequantize mode, exact window) and mlx-lm's
    BatchKVCache; after each, compare offsets, padding, size, masks and the unmasked fetched values."""
    for op, arg in ops:
        if op == "update":
            n, lengths = arg
            k, v = kv(n, 300 + ours.size(), b=len(ours.caches))
            if lengths is not None:
                for c in (ours, ref):
                    c.prepare(lengths=lengths, right_padding=[n - x for x in lengths])
            mask = ours.make_mask(n, return_array=True)
            assert np.array_equal(np.array(mask), np.array(ref.make_mask(n, return_array=True)))
            ko, vo = ours.update_and_fetch(k, v)
            kr, vr = ref.update_and_fetch(k, v)
            # keys some real query sees (right padding: sequence i's real queries are its first rows)
            real = [n] * len(ours.caches) if lengths is None else lengths
            m = np.array(mask)
            keep = np.stack([m[i, 0, :r].any(axis=0) for i, r in enumerate(real)])
            assert keep.sum() > 0
            for a, b in ((ko, kr), (vo, vr)):
                a, b = np.array(a).transpose(0, 2, 1, 3), np.array(b).transpose(0, 2, 1, 3)
                assert a.shape == b.shape
                np.testing.assert_array_equal(a[keep], b[keep])
            if lengths is not None:
                ours.finalize()
                ref.finalize()
        elif op == "left":           # a left-padded first chunk into an empty batch
            for c in (ours, ref):
                c.prepare(left_padding=arg)
        elif op == "filter":
            ours.filter(arg)
            ref.filter(arg)
        elif op == "extend":
            ours.extend(arg[0])
            ref.extend(arg[1])
        assert ours.offset.tolist() == ref.offset.tolist(), op
        assert ours.left_padding.tolist() == ref.left_padding.tolist(), op
        assert ours.size() == ref.size(), op


def test_protocol_matches_mlx_lm_batch_kv_cache():
    exact = dict(window=512, attention="dequantize")      # every token in the exact window
    lengths = [12, 3, 0]
    ours = vc.TurboQuantKVCache.merge(filled("turboquant", lengths, seed=7, **exact))
    refs = []
    for i, t in enumerate(lengths):
        r = mlx_cache.KVCache()
        if t:
            r.update_and_fetch(*kv(t, 7 + i))
        refs.append(r)
    ref = mlx_cache.KVCache.merge(refs)
    other = vc.TurboQuantKVCache.merge(filled("turboquant", [2, 6], seed=50, **exact))
    other_refs = []
    for i, t in enumerate([2, 6]):
        r = mlx_cache.KVCache()
        r.update_and_fetch(*kv(t, 50 + i))
        other_refs.append(r)
    other_ref = mlx_cache.KVCache.merge(other_refs)
    _drive(ours, ref, [("update", (1, None)), ("update", (5, [5, 2, 4])), ("update", (1, None)),
                       ("filter", [0, 2]), ("extend", (other, other_ref)), ("update", (1, None)),
                       ("filter", [1, 2, 3]), ("update", (4, [1, 4, 2])), ("update", (1, None))])


def test_left_padded_first_chunk_matches_mlx_lm():
    exact = dict(window=512, attention="dequantize")
    ours = vc.TurboQuantKVCache.merge([cache("turboquant", **exact) for _ in range(3)])
    ref = mlx_cache.KVCache.merge([mlx_cache.KVCache() for _ in range(3)])
    _drive(ours, ref, [("left", [2, 0, 4]), ("update", (5, None)), ("update", (1, None)), ("filter", [0, 2]),
                       ("update", (1, None))])
    assert [c.offset for c in ours.caches] == [5, 3]


@pytest.mark.parametrize("method,fp16_layers", [("turboquant", (0, 0)), ("kivi", (0, 0)), ("turboquant", (1, 0))])
def test_batched_attention_rows_equal_single_sequence_attention(method, fp16_layers):
    """The model-level check without generation: one forward over a merged batch (histories of different
    lengths, then a right-padded chunk, then a decode step) gives each sequence's real rows exactly the
    logits of its single-sequence cache. With an fp16 first layer, mlx-lm's BatchKVCache makes the mask and
    our layers cut each sequence's part out of it (the general path)."""
    model = tiny_llama(64, seed=3)
    singles, batch, chunk, chunk_lengths, out = merged_after_a_chunk(
        model, lambda: vc.make_prompt_cache(model, method=method, fp16_layers=fp16_layers, **SETTINGS[method]))
    step = mx.random.randint(0, VOCAB, (3, 1), key=mx.random.key(10))
    out_step = model(step, cache=batch)
    for i, c in enumerate(singles):
        n = chunk_lengths[i]
        ref = model(chunk[i:i + 1, :n], cache=c)
        np.testing.assert_array_equal(np.array(out[i, :n]), np.array(ref[0]))
        np.testing.assert_array_equal(np.array(out_step[i]), np.array(model(step[i:i + 1], cache=c)[0]))
        ours = [(x, b) for x, b in zip(c, batch) if isinstance(x, vc.VeloxKVCache)]
        assert len(ours) == 2 - sum(fp16_layers)
        assert [record_bytes(x) for x, _ in ours] == [record_bytes(b.extract(i)) for _, b in ours]


class _Tok:
    eos_token_ids: list = []

    def decode(self, tokens):
        return " ".join(map(str, tokens))


@pytest.fixture(scope="module", params=[64, 128])
def model(request):
    return tiny_llama(request.param, seed=0)


@pytest.mark.parametrize("method", ["turboquant", "kivi", "turboquant_prod"])
def test_batch_generate_equals_single_sequence_runs(model, method):
    """mlx_lm.batch_generate through our caches: each sequence's greedy tokens equal its single-sequence run
    wherever the fp16 cache's do (here: all of them, checked), with equal log-probabilities and final
    caches byte for byte; and the caches handed in stay as they were."""
    lengths = [5, 40, 23, 1]
    prompts = [mx.random.randint(0, VOCAB, (n,), key=mx.random.key(n)).tolist() for n in lengths]
    n_tokens = 6

    def single(p, c):
        out = list(generate_step(mx.array(p), model, max_tokens=n_tokens, prompt_cache=c))
        return [t for t, _ in out], [float(lp[t]) for t, lp in out]

    fp16_single = [single(p, mlx_cache.make_prompt_cache(model))[0] for p in prompts]
    fp16_batch = batch_generate(model, _Tok(), prompts, max_tokens=n_tokens, return_token_ids=True).token_ids
    assert fp16_single == fp16_batch, "fp16 batch and single runs differ on this model: pick other prompts"
    mk = lambda: vc.make_prompt_cache(model, method=method, **SETTINGS[method])     # noqa: E731
    singles = [mk() for _ in prompts]
    ref = [single(p, c) for p, c in zip(prompts, singles)]
    given = [mk() for _ in prompts]
    r = batch_generate(model, _Tok(), prompts, prompt_caches=given, max_tokens=n_tokens, return_token_ids=True,
                       return_logprobs=True, return_prompt_caches=True)
    assert r.token_ids == [t for t, _ in ref]
    assert r.logprobs == [lp for _, lp in ref]
    for got, want in zip(r.caches, singles):
        assert [type(c) for c in got] == [type(c) for c in want]
        assert [record_bytes(c) for c in got] == [record_bytes(c) for c in want]
    assert all(c.empty() for caches in given for c in caches)


def test_batch_generate_continues_prompt_caches_with_history(model):
    """Caches that already hold a prefix (of different lengths) are merged with left padding."""
    method = "turboquant"
    prefixes = [mx.random.randint(0, VOCAB, (n,), key=mx.random.key(60 + n)) for n in (20, 7)]
    rests = [mx.random.randint(0, VOCAB, (n,), key=mx.random.key(80 + n)).tolist() for n in (3, 11)]
    given, singles = [], []
    for p in prefixes:
        for dst in (given, singles):
            c = vc.make_prompt_cache(model, method=method, **SETTINGS[method])
            model(p[None], cache=c)
            dst.append(c)
    ref = [[t for t, _ in generate_step(mx.array(rest), model, max_tokens=5, prompt_cache=c)]
           for rest, c in zip(rests, singles)]
    r = batch_generate(model, _Tok(), rests, prompt_caches=given, max_tokens=5, return_token_ids=True,
                       return_prompt_caches=True)
    assert r.token_ids == ref
    for got, want in zip(r.caches, singles):
        assert [record_bytes(c) for c in got] == [record_bytes(c) for c in want]


def test_merge_rejects_mixed_caches():
    a, b = cache("turboquant"), cache("kivi")
    with pytest.raises(ValueError, match="caches: item 1"):
        vc.TurboQuantKVCache.merge([a, b])
    with pytest.raises(ValueError, match="caches: item 0 is a KVCache"):
        BatchVeloxKVCache.merge([mlx_cache.KVCache()])


def test_left_padded_prompts_attend_like_single_sequences():
    """prepare(left_padding=) then a left-padded chunk (packed mode): each sequence's real rows (at the end
    of its row block) give the logits of its own cache."""
    model = tiny_llama(64, seed=4)
    pads, n = [3, 0, 5], 8
    tokens = mx.random.randint(0, VOCAB, (3, n), key=mx.random.key(11))
    batch = [layer[0].merge(list(layer)) for layer in
             zip(*[vc.make_prompt_cache(model, method="turboquant", bits=4) for _ in pads])]
    for c in batch:
        c.prepare(left_padding=pads)
    out = model(tokens, cache=batch)
    step = mx.random.randint(0, VOCAB, (3, 1), key=mx.random.key(12))
    out_step = model(step, cache=batch)
    for i, p in enumerate(pads):
        c = vc.make_prompt_cache(model, method="turboquant", bits=4)
        np.testing.assert_array_equal(np.array(out[i, p:]), np.array(model(tokens[i:i + 1, p:], cache=c)[0]))
        np.testing.assert_array_equal(np.array(out_step[i]), np.array(model(step[i:i + 1], cache=c)[0]))


def test_batch_cache_saves_and_loads(tmp_path):
    batch = vc.KIVIKVCache.merge(filled("kivi", [20, 3]))
    batch.update_and_fetch(*kv(1, 400, b=2))
    saves_and_loads(batch, BatchVeloxKVCache, str(tmp_path / "batch.safetensors"), [21, 4])


def test_whole_chunks_are_cut_by_one_split_per_role_with_the_same_bytes(monkeypatch, tune):
    """A decode step of a batch (every sequence takes the whole chunk) cuts keys, values and queries with one
    mx.split each (tuning's split_rows); the stored bytes and the attention outputs equal the per-sequence slices'."""
    import veloxquant.accelerated.cache.batch as vb
    from mlx_lm.models import base

    def run(split: bool):
        tune(split_rows=split)
        calls = []
        real = vb.mx.split
        monkeypatch.setattr(vb.mx, "split", lambda *a, **kw: calls.append(a[1]) or real(*a, **kw))
        b = BatchVeloxKVCache.merge(filled("turboquant", [7, 3, 5], seed=3, window=0))
        outs = []
        for step in range(3):
            k, v = kv(1, 50 + step, b=3)
            q = mx.random.normal((3, 2 * H, 1, D), key=mx.random.key(90 + step)).astype(mx.float16)
            mask = b.make_mask(1)               # as a model makes it: before the layer's update
            kk, vv = b.update_and_fetch(k, v)
            outs.append(base.scaled_dot_product_attention(q, kk, vv, cache=b, scale=D ** -0.5, mask=mask))
        mx.eval(outs)
        monkeypatch.undo()
        return calls, [np.array(o) for o in outs], [record_bytes(b.extract(i)) for i in range(3)]

    calls, outs, stored = run(True)
    assert calls == [3] * 9, calls          # keys, values and queries, three steps
    calls0, outs0, stored0 = run(False)
    assert calls0 == [], calls0
    assert stored == stored0
    for a, b_ in zip(outs, outs0):
        assert np.array_equal(a, b_)
