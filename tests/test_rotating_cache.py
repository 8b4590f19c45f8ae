"""Sliding-window compressed caches (accelerated/cache/rotating.py; issue 10 item 2).

Oracles: mlx-lm's own RotatingKVCache (which tokens it holds after each update, in temporal order; its
masks; offset/size/trim), one-shot `accelerated.ops.encode` of those tokens (the stored bytes), the same
caches in dequantize mode (decode, then mlx-lm's SDPA) and, with every held token inside the exact window
R, mlx-lm's float cache itself.
"""
from __future__ import annotations

import importlib

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models import cache as mlx_cache

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import ops
from veloxquant.tools.quality import teacher_forced_logits
from _batch_util import chunk_through
from test_batch_shared import CODE_FLIP_ATOL

MAX = 16
CHUNKS = [40, 1, 1, 1, 5, 1, 1, 20, 1, 3] + [1] * 12      # prefill past the window, decode, verify-like chunks
GEMMA3 = dict(model_type="gemma3_text", hidden_size=128, num_hidden_layers=3, intermediate_size=256,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256, head_dim=64,
              sliding_window=MAX, sliding_window_pattern=3, query_pre_attn_scalar=64)


def bits(a) -> np.ndarray:
    a = mx.array(a)
    return np.array(a.view({1: mx.uint8, 2: mx.uint16, 4: mx.uint32}[a.itemsize]))


def temporal(ref: mlx_cache.RotatingKVCache):
    """mlx-lm's held keys and values in temporal order."""
    k, v = (ref._temporal_order(a) for a in (ref.keys, ref.values))
    n = min(ref.offset, k.shape[2])
    return k[:, :, :n], v[:, :, :n]


def feed(caches, chunks=CHUNKS, seed=0):
    rng = np.random.default_rng(seed)
    for n in chunks:
        k, v = (mx.array(rng.standard_normal((1, 2, n, 64)).astype(np.float16)) for _ in range(2))
        yield n, [c.update_and_fetch(k, v) for c in caches], [c.make_mask(n) for c in caches]


@pytest.mark.parametrize("method,kw", [("turboquant", dict(bits=4, window=0)),
                                       ("turboquant_prod", dict(bits=3, window=5)),
                                       ("rabitq", dict(bits=1, window=0))])
def test_holds_what_mlx_lm_holds_as_one_shot_records(method, kw):
    """After every update: the tokens held are mlx-lm's (same count, same order of arrival), stored as
    the one-shot record of exactly those tokens; masks equal mlx-lm's; offset, size, trimmability too."""
    ours, ref = vc.VeloxRotatingKVCache(MAX, method=method, seed=2, **kw), mlx_cache.RotatingKVCache(MAX)
    masks_before = []
    rng = np.random.default_rng(0)
    for n in CHUNKS:
        masks_before.append((ours.make_mask(n), ref.make_mask(n)))
        k, v = (mx.array(rng.standard_normal((1, 2, n, 64)).astype(np.float16)) for _ in range(2))
        ours.update_and_fetch(k, v)
        ref.update_and_fetch(k, v)
        rk, rv = temporal(ref)
        # _held(): the streams' count once a chunk the decode step left for its attention launch is stored (GPU)
        assert ours._held() == rk.shape[2] and ours.offset == ref.offset and ours.size() == ref.size()
        assert ours.is_trimmable() == ref.is_trimmable()
        for got, x, p in ((ours.state[0], rk, ours.key_params), (ours.state[1], rv, ours.value_params)):
            want = ops.encode(x, p)
            for f in want:
                np.testing.assert_array_equal(bits(got[f]), bits(want[f]), err_msg=f"{p.role} {f} after {n}")
    for a, b in masks_before:
        assert (a is None and b is None) or (isinstance(a, str) and a == b) or bool(mx.all(a == b))


def test_kivi_evicts_whole_groups():
    """kivi: encoded tokens leave in whole groups; the extra (at most G - 1) tokens are masked out."""
    ours = vc.VeloxRotatingKVCache(MAX, method="kivi", bits=4, group_size=16, window=2, seed=2)
    ref = mlx_cache.RotatingKVCache(MAX)
    for n, _, _ in feed([ours, ref]):
        held, ref_held = ours._k.tokens, temporal(ref)[0].shape[2]
        assert ref_held <= held < ref_held + 16 and ours.offset == ref.offset
        old = ours._held_after_eviction()           # what the next one-token update attends over, + 1
        mask = ours.make_mask(1)
        assert MAX - 1 <= old < MAX - 1 + 16 or old == held < MAX
        if old + 1 > MAX:       # the next one-token step must see only the newest MAX tokens
            m = np.array(mask).reshape(-1)
            assert m.shape == (old + 1,) and m.sum() == MAX and m[-MAX:].all()
        else:
            assert mask is None


def test_eviction_is_restorable_and_compaction_frees_rows(monkeypatch, tune):
    """Deferred checks roll back across an eviction (to the state before the chunk, less the token its
    eviction dropped, which no later query can attend to); compaction copies only the held rows."""
    tune(compact_rows=8)
    c = vc.VeloxRotatingKVCache(MAX, method="turboquant", bits=4, window=3, seed=2)
    ref = mlx_cache.RotatingKVCache(MAX)
    for _ in feed([c, ref], [40] + [1] * 30):
        assert c._k.dead_rows() <= max(8, c._k.tokens) + 1
    rk, _ = temporal(ref)
    assert c._k.tokens == rk.shape[2] == MAX
    before = {f: bits(a) for f, a in c.state[0].items()}
    bad = mx.full((1, 2, 1, 64), float("nan"), dtype=mx.float16)
    c.update_and_fetch(bad, bad)                       # evicts one token, stores the bad chunk (deferred)
    ok = mx.zeros((1, 2, 1, 64), dtype=mx.float16)
    with pytest.raises(ValueError, match="NaN"):
        c.update_and_fetch(ok, ok)
        c.check()
    after = {f: bits(a) for f, a in c.state[0].items() if f != "kept"}
    assert c.offset == ref.offset and c._k.tokens == MAX - 1 and after.keys() == before.keys() - {"kept"}
    for f, a in after.items():    # the oldest token (an encoded one: R = 3) is gone, the rest unchanged
        np.testing.assert_array_equal(a, before[f] if f == "window" else before[f][:, :, 1:], err_msg=f)


@pytest.mark.parametrize("method,kw", [("turboquant", dict(bits=4, window=3)),
                                       ("kivi", dict(bits=2, group_size=16, window=4))])
def test_compaction_leaves_room_until_the_next_one(monkeypatch, tune, method, kw):
    """Compaction copies the held rows into buffers with room for the rows appended until the next compaction
    (rotating.py: a growth in between would take that step off the decode step): over several compaction cycles of
    one-token steps no buffer grows after the prefill, and the stored records are those of a compaction
    into exact-size buffers (Stream.compact(0), a second cache), bit for bit."""
    from veloxquant.accelerated import stream
    tune(compact_rows=8)
    caches = [vc.VeloxRotatingKVCache(24, method=method, seed=2, **kw) for _ in range(2)]
    real = stream.Stream.compact
    tight, compacted, grown = set(), [], []     # the second cache's streams: exact-size buffers

    def compact(self, room=0):
        compacted.append(id(self))
        return real(self, 0 if id(self) in tight else room)
    monkeypatch.setattr(stream.Stream, "compact", compact)
    def spy(grow):
        def rows(self, a):
            before = self.buf
            out = grow(self, a)
            if before is not None and self.buf is not before:
                grown.append(id(self))
            return out
        return rows
    monkeypatch.setattr(stream._Rows, "extend", spy(stream._Rows.extend))
    monkeypatch.setattr(stream._Rows, "reserve", spy(stream._Rows.reserve))
    for i, _ in enumerate(feed(caches, [30] + [1] * 150)):
        if i == 0:
            tight.update(id(s) for s in (caches[1]._k, caches[1]._v))
            ours = {id(r) for s in (caches[0]._k, caches[0]._v) for r in s._rows.values()}
            grown.clear()
        for a, b in zip(caches[0].state[:2], caches[1].state[:2]):
            assert a.keys() == b.keys() and all(np.array_equal(np.array(a[n]), np.array(b[n])) for n in a), i
    assert len(set(compacted)) == 4 and len(compacted) >= 12, f"{len(compacted)} stream compactions in the run"
    assert not ours & set(grown), f"a buffer grew after a compaction ({len(grown)} growths)"


def test_trim_only_before_eviction():
    c = vc.VeloxRotatingKVCache(MAX, method="turboquant", bits=4, window=4, seed=2)
    ref = mlx_cache.RotatingKVCache(MAX)
    list(feed([c, ref], [10, 1, 1]))
    assert c.is_trimmable() and ref.is_trimmable()
    assert c.trim(3) == ref.trim(3) == 3 and c.offset == ref.offset == 9
    list(feed([c, ref], [1] * 10, seed=1))
    assert not c.is_trimmable() and not ref.is_trimmable()
    with pytest.raises(ValueError, match="n: "):
        c.trim(1)


def _gemma3(dtype):
    mod = importlib.import_module("mlx_lm.models.gemma3_text")
    mx.random.seed(1)
    model = mod.Model(mod.ModelArgs(**GEMMA3))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def test_make_prompt_cache_chooses_per_layer():
    model = _gemma3(mx.float16)
    caches = vc.make_prompt_cache(model, method="turboquant", bits=4)
    assert [type(c).__name__ for c in caches] == ["VeloxRotatingKVCache", "VeloxRotatingKVCache",
                                                  "TurboQuantKVCache"]
    assert all(c.max_size == MAX and c.attention == "packed" for c in caches[:2])
    assert [type(c) for c in vc.make_prompt_cache(model, compress_sliding=False)][:2] == \
        [mlx_cache.RotatingKVCache] * 2
    # kivi with an fp16 sliding layer: every sliding layer stays mlx-lm's (they share layer 0's mask)
    kivi = vc.make_prompt_cache(model, method="kivi", group_size=16, fp16_layers=(1, 0))
    assert [type(c).__name__ for c in kivi] == ["RotatingKVCache", "RotatingKVCache", "KIVIKVCache"]
    mixed = vc.make_prompt_cache(model, method="turboquant", fp16_layers=(1, 0))
    assert [type(c).__name__ for c in mixed] == ["RotatingKVCache", "VeloxRotatingKVCache", "TurboQuantKVCache"]


SEQ = mx.random.randint(0, 256, (70,), key=mx.random.key(4))


def test_gemma3_exact_window_equals_mlx_lm():
    """R = 128 > every held count: all tokens exact, so the model's logits equal mlx-lm's own caches' up to
    float32 rounding (the rotation, eviction and masks are mlx-lm's)."""
    model = _gemma3(mx.float32)
    ours = vc.make_prompt_cache(model, method="turboquant", bits=4, window=128, seed=3)
    assert isinstance(ours[0], vc.VeloxRotatingKVCache)
    got = np.array(teacher_forced_logits(model, ours, SEQ, 40))
    want = np.array(teacher_forced_logits(model, model.make_cache(), SEQ, 40))
    assert np.abs(got - want).max() < 1e-4, np.abs(got - want).max()


@pytest.mark.parametrize("method,kw", [("turboquant", dict(bits=4)), ("kivi", dict(bits=4, group_size=16,
                                                                                    window=4))])
def test_gemma3_packed_equals_decode_then_sdpa(method, kw):
    """float32 model: attention over the packed records gives the logits of decoding the same records and
    running mlx-lm's SDPA (compressed sliding and global layers), to float32 rounding."""
    model = _gemma3(mx.float32)
    packed = vc.make_prompt_cache(model, method=method, seed=3, **kw)
    deq = vc.make_prompt_cache(model, method=method, seed=3, attention="dequantize", **kw)
    a = np.array(teacher_forced_logits(model, packed, SEQ, 40))
    b = np.array(teacher_forced_logits(model, deq, SEQ, 40))
    assert np.abs(a - b).max() < 1e-4, np.abs(a - b).max()
    toks = [t for t, _ in generate_step(SEQ[:40], model, max_tokens=24, prompt_cache=packed)]
    ref = [t for t, _ in generate_step(SEQ[:40], model, max_tokens=24, prompt_cache=deq)]
    assert toks == ref


def test_gemma3_save_load_round_trip(tmp_path):
    model = _gemma3(mx.float16)
    a = vc.make_prompt_cache(model, method="turboquant", bits=4, window=4, seed=3)
    b = vc.make_prompt_cache(model, method="turboquant", bits=4, window=4, seed=3)
    for c in (a, b):
        list(generate_step(SEQ[:40], model, max_tokens=8, prompt_cache=c))
    path = str(tmp_path / "gemma3.safetensors")
    mlx_cache.save_prompt_cache(path, a)
    loaded = mlx_cache.load_prompt_cache(path)
    assert [type(c) for c in loaded] == [type(c) for c in a]
    for x, y in zip(loaded, a):
        assert x.offset == y.offset and getattr(x, "max_size", None) == getattr(y, "max_size", None)
        for rx, ry in zip(x.state[:2], y.state[:2]):
            assert rx.keys() == ry.keys() and all(np.array_equal(bits(rx[f]), bits(ry[f])) for f in rx)
    y = SEQ[40:41]
    assert [t for t, _ in generate_step(y, model, max_tokens=6, prompt_cache=loaded)] == \
        [t for t, _ in generate_step(y, model, max_tokens=6, prompt_cache=b)]


def _rotating_batch_flow(model, make):
    """mlx-lm's batching over sliding-window caches whose histories passed max_size (merge, decode steps, a
    right-padded chunk, finalize, a decode step): [(batched logits, single-sequence logits)] per sequence and step.
    `make(layer)` makes one layer's single-sequence cache."""
    from veloxquant.tools.quality import VOCAB
    singles = []
    for n in (30, 9, 21):
        c = [make(i) for i in range(2)]
        model(mx.random.randint(0, VOCAB, (1, n), key=mx.random.key(n)), cache=c)
        singles.append(c)
    batch = [layer[0].merge(list(layer)) for layer in zip(*singles)]
    pairs = []

    def keep(out, tokens, lengths):
        for i, c in enumerate(singles):
            pairs.append((np.array(out[i, :lengths[i]]), np.array(model(tokens[i:i + 1, :lengths[i]], cache=c)[0]), i))

    for s in range(3):
        tok = mx.random.randint(0, VOCAB, (3, 1), key=mx.random.key(100 + s))
        keep(model(tok, cache=batch), tok, [1, 1, 1])
    lengths = [3, 6, 1]
    chunk = mx.random.randint(0, VOCAB, (3, 6), key=mx.random.key(9))
    keep(chunk_through(model, batch, chunk, lengths), chunk, lengths)
    tok = mx.random.randint(0, VOCAB, (3, 1), key=mx.random.key(200))
    keep(model(tok, cache=batch), tok, [1, 1, 1])
    return batch, pairs


def _device_gap(pairs) -> float:
    """The largest batched-vs-single difference of a flow: 0 on the CPU (the model's batched and single matmuls
    round alike), float16 roundings on CUDA (other GEMM tilings for 3 rows than for 1)."""
    return max(float(np.abs(g - w).max()) for g, w, _ in pairs)


@pytest.mark.parametrize("kw", [dict(method="turboquant", bits=4, window=0),
                                dict(method="kivi", bits=4, group_size=16, window=2)], ids=["turboquant", "kivi"])
def test_a_batch_of_sliding_window_caches_gives_each_sequence_its_own_logits(kw):
    """mlx-lm's batching (merge, decode steps, a right-padded chunk, finalize) over sliding-window caches whose
    histories passed max_size: each sequence attends over the tokens its own cache holds with the mask its own cache
    gives (a band over a multi-token chunk; kivi's extra group tokens hidden in a decode step), so its logits are
    its single cache's: bit for bit where the batch attends per sequence (kivi: a cache per sequence), within the
    B-row cache's tolerance (its rows' splits differ on a GPU) for turboquant (batch_shared: one B-row cache); both
    plus the gap mlx-lm's fp16 KVCache shows between batched and single logits of the same token flow on this
    device (0 on the CPU; mlx-lm's BatchRotatingKVCache is no baseline: in this flow its batched logits differ from
    its single caches' by up to 0.75 on the CPU too)."""
    from veloxquant.accelerated.cache.batch import BatchVeloxKVCache
    from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
    from veloxquant.tools.quality import tiny_llama
    model = tiny_llama(64, seed=3, layers=2)
    gap = _device_gap(_rotating_batch_flow(model, lambda i: mlx_cache.KVCache())[1])
    batch, pairs = _rotating_batch_flow(model, lambda i: vc.VeloxRotatingKVCache(MAX, layer=i, seed=2, **kw))
    shared = kw["method"] != "kivi"
    assert {type(c) for c in batch} == {SharedBatchVeloxKVCache if shared else BatchVeloxKVCache}
    tol = dict(rtol=2.0 ** -9, atol=2.0 ** -12 + gap) if shared else dict(rtol=0, atol=gap)  # test_batch_shared's
    for g, w, i in pairs:
        np.testing.assert_allclose(g, w, err_msg=f"sequence {i} (device gap {gap:.3g})", **tol)


def test_a_left_padded_prompt_batch_of_sliding_window_caches_gives_each_sequence_its_own_logits():
    """Prompts longer than max_size left-padded into one chunk (prepare(left_padding=...) on an empty merged batch),
    then decode steps: each sequence's logits are its single cache's (the padded chunk runs per sequence: its band
    and the padding rows' starts are no row-start mask), and the batch is one B-row cache afterwards; within the
    B-row tolerance plus the gap mlx-lm's fp16 KVCache shows between batched and single logits of the same token
    flow on this device (0 on the CPU), and where that gap is nonzero CODE_FLIP_ATOL per quantized layer."""
    from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
    from veloxquant.tools.quality import VOCAB, tiny_llama
    model = tiny_llama(64, seed=3, layers=2)

    def flow(make, check_type=False):
        singles = [[make(i) for i in range(2)] for _ in range(3)]
        batch = [layer[0].merge(list(layer)) for layer in zip(*singles)]
        lengths, n = [20, 6, 13], 20
        toks = mx.random.randint(0, VOCAB, (3, n), key=mx.random.key(5))
        for c in batch:
            c.prepare(left_padding=[n - t for t in lengths])
        outs = [(model(toks, cache=batch), toks, [n - t for t in lengths])]
        if check_type:
            assert all(type(c) is SharedBatchVeloxKVCache and c._seq is None for c in batch)
        for s in range(MAX + 2):
            t = mx.random.randint(0, VOCAB, (3, 1), key=mx.random.key(50 + s))
            outs.append((model(t, cache=batch), t, [0, 0, 0]))
        return [(np.array(out[i, lp[i]:]), np.array(model(t[i:i + 1, lp[i]:], cache=c)[0]), i)
                for out, t, lp in outs for i, c in enumerate(singles)]

    gap = _device_gap(flow(lambda i: mlx_cache.KVCache()))
    pairs = flow(lambda i: vc.VeloxRotatingKVCache(MAX, method="turboquant", bits=4, layer=i, seed=2), True)
    # where the device gap is nonzero, each layer encodes keys and values made slightly differently batched and single
    # (the first layer's by the model's batched matmuls, the second's by the first's output too), and a code can
    # flip in each of them (test_batch_shared's CODE_FLIP_ATOL per quantized layer)
    flip = CODE_FLIP_ATOL * len(model.layers) if gap > 0 else 0.0
    for g, w, i in pairs:
        np.testing.assert_allclose(g, w, rtol=2.0 ** -9, atol=2.0 ** -12 + gap + flip,
                                   err_msg=f"sequence {i} (device gap {gap:.3g})")
