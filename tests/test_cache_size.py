"""What a compressed cache costs (issue 33 item 3; accelerated/cache/size.py).

Checked: (1) at make_prompt_cache's defaults every method at its default bits, with its default window and with
a window of 32, head dims 64 and 128, holds at most what mlx-lm's float16 KVCache holds for the same tokens after
every decode step from the first, and strictly less once a token is encoded (fails with the former default
exact_trim = 32: a windowed cache's exact-trim copies made it larger than float16 for tens of tokens);
(2) `nbytes_for` (the cost of a length, known before the first update) equals `nbytes_parts` after appending
that many tokens in any chunks, and the parts add up to `nbytes`, with and without exact-trim copies;
(3) the CLI's size line reports those parts.
"""
from __future__ import annotations

import types

import mlx.core as mx
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant import spec
from veloxquant.tools.cli import kv_flags

MODEL = types.SimpleNamespace(layers=[types.SimpleNamespace()])     # one attention layer, attention="dequantize"
HEADS = 2


def fp16_bytes(tokens: int, d: int) -> int:
    return 2 * HEADS * tokens * d * 2          # keys and values, float16 (mlx-lm's KVCache)


def first_encoded(p: spec.Params) -> int:
    """The first T at which a one-shot encode has an encoded token (Q(T) > 0)."""
    return next(t for t in range(1, 10_000) if p.encoded_tokens(t) > 0)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("window", [None, 32])
@pytest.mark.parametrize("method", spec.METHODS)
def test_never_larger_than_fp16_at_the_defaults(method, window, d):
    (c,) = vc.make_prompt_cache(MODEL, method=method, window=window, attention="dequantize")
    p = c.key_params
    start = first_encoded(p)
    x = mx.random.normal((1, HEADS, start + 60, d), key=mx.random.key(d)).astype(mx.float16)
    c.update_and_fetch(x[:, :, :1], x[:, :, :1])
    for t in range(1, x.shape[2] + 1):       # a prefill token, then decode steps
        if t > 1:
            c.update_and_fetch(x[:, :, t - 1 : t], x[:, :, t - 1 : t])
        got, fp16 = c.nbytes, fp16_bytes(t, d)
        assert got <= fp16, f"{method} R={p.window} d={d}: {got} bytes after {t} tokens > float16's {fp16}"
        if t >= start:
            assert got < fp16, f"{method} R={p.window} d={d}: {got} bytes after {t} tokens, float16 {fp16}"
    assert c.nbytes_parts["kept"] == 0


CASES = [("turboquant", dict(window=8), 0), ("turboquant", dict(window=8), 5), ("turboquant", dict(window=0), 32),
         ("kivi", dict(), 0), ("kivi", dict(window=16, group_size=32), 40), ("kivi", dict(window=0), 3),
         ("turboquant_rvq", dict(window=4), 7), ("turboquant_prod", dict(window=3), 2), ("rabitq", dict(), 0),
         ("mlx_affine", dict(window=2), 9)]


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
@pytest.mark.parametrize("method,kw,exact_trim", CASES)
def test_nbytes_for_states_the_cost_before_the_first_update(method, kw, exact_trim, dtype):
    d, b = 64, 2
    x = mx.random.normal((b, HEADS, 250, d), key=mx.random.key(1)).astype(dtype)
    for total, chunks in ((1, [1]), (9, [4, 1, 4]), (40, [40]), (250, [100, 1, 1, 148])):
        c = vc.VeloxKVCache(method=method, exact_trim=exact_trim, attention="dequantize", **kw)
        want = c.nbytes_for(total, heads=HEADS, head_dim=d, dtype=dtype, batch=b)
        lo = 0
        for n in chunks:
            c.update_and_fetch(x[:, :, lo : lo + n], x[:, :, lo : lo + n])
            lo += n
        assert c.nbytes_parts == want, (method, kw, exact_trim, total)
        assert sum(want.values()) == c.nbytes
        assert c.nbytes_for(total) == want          # shape and dtype from the stored tokens
    cap = c.key_params.kept_capacity() if (method == "kivi" or c.key_params.window) else 0
    assert want["kept"] == 2 * min(cap, c.key_params.encoded_tokens(250)) * b * HEADS * d * dtype.size


def test_nbytes_for_needs_the_shape_before_the_first_update():
    c = vc.TurboQuantKVCache(window=8)
    with pytest.raises(ValueError, match="head_dim"):
        c.nbytes_for(10)
    with pytest.raises(ValueError, match="tokens"):
        c.nbytes_for(-1, heads=1, head_dim=64)
    with pytest.raises(ValueError, match="dtype"):
        c.nbytes_for(1, heads=1, head_dim=64, dtype=mx.int8)


def test_cli_size_line_reports_the_parts():
    d = 64
    caches = vc.make_prompt_cache(types.SimpleNamespace(layers=[object(), object()]), window=8, exact_trim=5,
                                  attention="dequantize", fp16_layers=(1, 0))
    x = mx.random.normal((1, HEADS, 31, d), key=mx.random.key(2)).astype(mx.float16)
    caches[0].update_and_fetch(x, x)
    caches[1].update_and_fetch(x, x)
    parts = caches[1].nbytes_parts
    line = kv_flags.report(caches)
    stored, fp16 = sum(parts.values()), fp16_bytes(31, d)
    assert line.startswith(f"31 tokens; 1 of 2 layers compressed: {stored / 1024:.1f} KiB (the same tokens in "
                           f"float16: {fp16 / 1024:.1f} KiB, ratio {stored / fp16:.3f})")
    assert f"{parts['encoded'] / 1024:.1f} KiB records of 23 encoded tokens" in line
    assert f"{parts['window'] / 1024:.1f} KiB window of 8 exact tokens" in line
    assert f"{parts['kept'] / 1024:.1f} KiB exact-trim copies of 5 tokens" in line
    assert parts["kept"] == 2 * 5 * HEADS * d * 2
