"""Helpers of the batch-cache tests (tests/test_batch_cache.py: a cache per sequence; tests/test_batch_shared.py:
one B-row cache): keys and values, record bytes, prefilled single caches, the batched appends both run; a ragged
record with the bytes no row may read poisoned (the ragged KIVI kernels' tests); the mask types our attention is
handed, each row's attention against its single cache's, a merged batch of prompt caches after a chunk."""
from __future__ import annotations

import contextlib

import mlx.core as mx
import numpy as np

from veloxquant.accelerated import layouts
from veloxquant.accelerated.cache import ragged
from veloxquant.accelerated.ops import attention as oatt

H, D = 2, 64


def kv(t, seed, b=1):
    k = mx.random.normal((b, H, t, D), key=mx.random.key(seed)).astype(mx.float16)
    v = mx.random.normal((b, H, t, D), key=mx.random.key(seed + 1000)).astype(mx.float16)
    return k, v


def record_bytes(c, meta: bool = True) -> dict:
    """A cache's record bytes per field (and its meta JSON with `meta`)."""
    k, v, m = c.state
    out = {} if k is None else {f"{r}.{n}": np.array(a).tobytes() for r, rec in (("k", k), ("v", v))
                                for n, a in rec.items()}
    if meta:
        out["meta"] = m
    return out


def filled_with(make, lengths, seed=0) -> list:
    """Caches from make(), the i-th holding lengths[i] tokens."""
    caches = []
    for i, t in enumerate(lengths):
        c = make()
        if t:
            c.update_and_fetch(*kv(t, seed + i))
        caches.append(c)
    return caches


def appends_like_singles(batch, singles, before: list, record) -> None:
    """Three decode steps and a right-padded prefill chunk (then finalize) through a batch of the 4 caches
    `singles`, the same through each single cache: merge left those as they were (`before`), and afterwards each
    sequence's offset and bytes (`record`) are its single cache's."""
    steps = [kv(1, 100 + s, b=4) for s in range(3)]
    chunk_lengths = [3, 9, 1, 0]
    chunk = kv(9, 200, b=4)
    for k, v in steps:
        batch.update_and_fetch(k, v)
    batch.prepare(lengths=chunk_lengths, right_padding=[9 - n for n in chunk_lengths])
    batch.update_and_fetch(*chunk)
    batch.finalize()
    assert [record(c) for c in singles] == before, "merge must not update the caches it was given"
    for i, c in enumerate(singles):
        for k, v in steps:
            c.update_and_fetch(k[i:i + 1], v[i:i + 1])
        if chunk_lengths[i]:
            c.update_and_fetch(chunk[0][i:i + 1, :, :chunk_lengths[i]], chunk[1][i:i + 1, :, :chunk_lengths[i]])
    assert batch.offset.tolist() == [c.offset for c in singles]
    assert [record(batch.extract(i)) for i in range(4)] == [record(c) for c in singles]


def saves_and_loads(batch, cls, path: str, offsets: list, meta: bool = True) -> None:
    """A batch cache through mlx-lm's save_prompt_cache / load_prompt_cache: the same class, offsets, left padding,
    size and each sequence's record bytes (with `meta`, its meta JSON too)."""
    from mlx_lm.models import cache as mlx_cache
    mlx_cache.save_prompt_cache(path, [batch])
    (loaded,) = mlx_cache.load_prompt_cache(path)
    assert isinstance(loaded, cls)
    assert loaded.offset.tolist() == batch.offset.tolist() == offsets
    assert loaded.left_padding.tolist() == batch.left_padding.tolist() and loaded.size() == batch.size()
    assert [record_bytes(loaded.extract(i), meta) for i in range(len(offsets))] == \
        [record_bytes(batch.extract(i), meta) for i in range(len(offsets))]


def poisoned(rec: oatt.RaggedRecord, stream: ragged.RaggedStream) -> oatt.RaggedRecord:
    """rec with every byte no row may read all bits set: per row, field rows below its first token (group rows below
    its first group) and past its own boundary, window slots below its own window."""
    rec.sync()      # an in-place store still pending (a GPU's lazy launch) writes these buffers: copy them after it
    p, pads, bnd = stream.params, stream._pads, stream.bounds()
    g = p.group_size
    ph = ragged.phases(pads, p)
    grouped = layouts.of(p).group_rows(p.role)
    fields = {}
    for name, a in rec.fields.items():
        n = np.array(a).copy()
        for i, (pad, bi, f) in enumerate(zip(pads, bnd, ph)):
            lo, hi = ((pad - f) // g, max(bi - f, 0) // g) if name in grouped else (pad, bi)
            n[i, :, :lo].view(np.uint8)[...] = 0xFF
            n[i, :, max(hi, lo):].view(np.uint8)[...] = 0xFF
        fields[name] = mx.array(n)
    w = np.array(rec.window).copy()
    for i, (pad, bi) in enumerate(zip(pads, bnd)):
        w[i, :, :max(bi, pad) - rec.encoded].view(np.uint8)[...] = 0xFF
    return oatt.RaggedRecord(rec.params, fields, mx.array(w), rec.encoded, rec.decode_tokens, None, rec.phases,
                             rec.decoded)


@contextlib.contextmanager
def masks_attended():
    """The types of the masks the hooked dispatch hands our attention (accelerated.cache.integration.attend), in
    order."""
    import veloxquant.accelerated.cache.integration as hook
    seen, real = [], hook.attend

    def spy(q, k, v, scale, mask=None, sinks=None):
        seen.append(type(mask))
        return real(q, k, v, scale, mask)
    hook.attend = spy
    try:
        yield seen
    finally:
        hook.attend = real


def attends_like_singles(batch, singles, steps: int) -> list:
    """`steps` decode steps through a 3-row `batch` and through each of its `singles`: each row's attention output is
    its single cache's within the tier's float32 tolerance. The mask types attended (the batch's calls; the singles'
    are None), in order."""
    from mlx_lm.models import base
    with masks_attended() as seen:
        for step in range(steps):
            q = mx.random.normal((3, 2 * H, 1, D), key=mx.random.key(70 + step)).astype(mx.float32)
            k, v = kv(1, 80 + step, b=3)
            mask = batch.make_mask(1)
            kk, vv = batch.update_and_fetch(k, v)
            out = np.array(base.scaled_dot_product_attention(q, kk, vv, cache=batch, scale=D ** -0.5, mask=mask))
            for i, c in enumerate(singles):
                ks, vs = c.update_and_fetch(k[i:i + 1], v[i:i + 1])
                want = np.array(base.scaled_dot_product_attention(q[i:i + 1], ks, vs, cache=c, scale=D ** -0.5,
                                                                  mask=None))
                np.testing.assert_allclose(out[i:i + 1], want, rtol=0, atol=1e-5, err_msg=f"row {i} step {step}")
    return seen


def merged_after_a_chunk(model, make_cache):
    """Histories of 30, 9 and 17 tokens, each prefilled into its own prompt cache (`make_cache()`), the caches merged
    layer by layer, then a right-padded chunk of 2, 6 and 1 real tokens through the merged batch (finalized):
    (single caches, batch caches, chunk tokens, chunk lengths, the chunk's batched logits)."""
    from veloxquant.tools.quality import VOCAB
    prompts = [mx.random.randint(0, VOCAB, (n,), key=mx.random.key(40 + n)) for n in (30, 9, 17)]
    singles = []
    for p in prompts:
        c = make_cache()
        model(p[None], cache=c)
        singles.append(c)
    batch = [layer[0].merge(list(layer)) for layer in zip(*singles)]
    chunk_lengths = [2, 6, 1]
    chunk = mx.random.randint(0, VOCAB, (3, 6), key=mx.random.key(9))
    return singles, batch, chunk, chunk_lengths, chunk_through(model, batch, chunk, chunk_lengths)


def chunk_through(model, batch, chunk, lengths):
    """A right-padded chunk (`lengths[i]` real tokens in row i) through the model over a batch of layer caches,
    which are then finalized: the chunk's logits."""
    for c in batch:
        c.prepare(lengths=lengths, right_padding=[chunk.shape[1] - n for n in lengths])
    out = model(chunk, cache=batch)
    for c in batch:
        c.finalize()
    return out
