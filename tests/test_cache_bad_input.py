"""Bad input to accelerated.cache raises ValueError naming the argument and leaves the cache untouched
(spec/number-model.md 'Special values' and the API rejections; spec/streaming.md 'Appending a chunk' and
'Deferred rejection'). Every case runs with checks="eager" (raised by the append itself) and
checks="deferred" (shape/dtype errors at once, data errors at the next check point: `check()` here, a
later append in generation), and the cache must be the one before the bad chunk either way."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated.attention import PackedKV

CONFIGS = {
    "turboquant": (vc.TurboQuantKVCache, dict(bits=4)),
    "turboquant_rvq": (vc.TurboQuantRVQKVCache, dict(bits=2)),
    "turboquant_prod": (vc.TurboQuantProdKVCache, dict(bits=3)),
    "kivi": (vc.KIVIKVCache, dict(bits=2, group_size=16, window=4)),
    "rabitq": (vc.RaBitQKVCache, dict(bits=1)),
}
METHODS = list(CONFIGS)


def as_bits(a: mx.array) -> np.ndarray:
    if isinstance(a, PackedKV):    # packed mode: compare the decoded record
        a = a.dequantized()
    return np.array(a.view({1: mx.uint8, 2: mx.uint16, 4: mx.uint32}[a.itemsize]))


def snapshot(c):
    k, v, meta = c.state
    arrays = {} if k is None else {**{"k." + n: as_bits(a) for n, a in k.items()},
                                   **{"v." + n: as_bits(a) for n, a in v.items()}}
    return arrays, meta, c.offset, c.nbytes


def assert_unchanged(c, snap):
    arrays, meta, offset, nbytes = snapshot(c)
    assert (meta, offset, nbytes) == snap[1:]
    assert list(arrays) == list(snap[0])
    for n in arrays:
        np.testing.assert_array_equal(arrays[n], snap[0][n], err_msg=n)


def rnd(shape, dtype=mx.float16, seed=0):
    return mx.random.normal(shape, key=mx.random.key(seed)).astype(dtype)


def with_value(x, value):
    """x with element [0, 1, 2, 3] set to value (float32 math, then x's dtype)."""
    a = np.array(x.astype(mx.float32))
    a[0, 1, min(2, a.shape[2] - 1), 3] = value
    return mx.array(a).astype(x.dtype)


CHECKS = ["eager", "deferred"]


def started(method, dtype=mx.float16, checks="eager"):
    cls, kw = CONFIGS[method]
    c = cls(**kw, seed=3, layer=1, checks=checks)
    c.update_and_fetch(rnd((1, 2, 21, 64), dtype, 1), rnd((1, 2, 21, 64), dtype, 2))
    return c


def append_rejected(c, k, v, name):
    """The append of (k, v) fails with a ValueError naming `name`, now or at the deferred check."""
    with pytest.raises(ValueError, match=name):
        c.update_and_fetch(k, v)
        c.check()


def bad_chunks(dtype):
    good = rnd((1, 2, 3, 64), dtype, 5)
    return {
        "keys nan": ("keys", with_value(good, float("nan")), good),
        "keys +inf": ("keys", with_value(good, float("inf")), good),
        # values rejected after the keys were accepted: the keys must be rolled back
        "values nan": ("values", good, with_value(good, float("nan"))),
        "values -inf": ("values", good, with_value(good, float("-inf"))),
        "values int32": ("values", good, good.astype(mx.int32)),
        "keys dtype change": ("keys", good.astype(mx.bfloat16 if dtype != mx.bfloat16 else mx.float16),
                              good),
        "values rank 3": ("values", good, good[0]),
        "values t mismatch": ("values", good, good[:, :, :2]),
        "keys empty t": ("keys", good[:, :, :0], good[:, :, :0]),
        "values head dim 36": ("values", good, good[..., :36]),     # not m * 2^k (48 is, since spec 1.1)
        "keys head dim change": ("keys", good[..., :32], good),
        "keys heads change": ("keys", good[:, :1], good[:, :1]),
        "keys not an array": ("keys", np.zeros((1, 2, 3, 64), np.float16), good),
    }


@pytest.mark.parametrize("checks", CHECKS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", list(bad_chunks(mx.float16)))
def test_bad_chunk_leaves_cache_unchanged(method, case, checks):
    c = started(method, checks=checks)
    snap = snapshot(c)
    name, k, v = bad_chunks(mx.float16)[case]
    append_rejected(c, k, v, name)
    assert_unchanged(c, snap)
    # and the cache still works, exactly as one that never saw the bad chunk
    ref = started(method)
    good = rnd((1, 2, 3, 64), mx.float16, 5)
    for a, b in zip(c.update_and_fetch(good, good), ref.update_and_fetch(good, good)):
        np.testing.assert_array_equal(as_bits(a), as_bits(b))


@pytest.mark.parametrize("checks", CHECKS)
@pytest.mark.parametrize("method", ["turboquant", "turboquant_rvq", "turboquant_prod", "rabitq"])
def test_norm_overflow_in_values_rolls_back_keys(method, checks):
    # float32 values whose squares overflow binary32: norm = +Inf is rejected (number-model.md)
    c = started(method, mx.float32, checks)
    snap = snapshot(c)
    good = rnd((1, 2, 2, 64), mx.float32, 9)
    append_rejected(c, good, with_value(good, 3e38), "values: x: norm overflows")
    assert_unchanged(c, snap)


@pytest.mark.parametrize("checks", CHECKS)
def test_kivi_float16_scale_overflow_rejected(checks):
    c = started("kivi", mx.float32, checks)
    snap = snapshot(c)
    good = rnd((1, 2, 16, 64), mx.float32, 9)
    big = with_value(good, 1e6)   # (max - min) / L beyond float16's range for the value group
    append_rejected(c, good, big, "values: x: kivi float16")
    assert_unchanged(c, snap)


@pytest.mark.parametrize("checks", CHECKS)
def test_first_chunk_rejected_leaves_cache_empty(checks):
    c = vc.TurboQuantKVCache(bits=4, checks=checks)
    good = rnd((1, 2, 3, 64))
    append_rejected(c, good, with_value(good, float("nan")), "values: x: contains NaN")
    assert c.empty() and c.offset == 0 and c.nbytes == 0
    with pytest.raises(ValueError, match="head dim"):
        c.update_and_fetch(good[..., :36], good[..., :36])      # 24 = 12 * 2 is a head dim since spec 1.1
    assert c.empty()


@pytest.mark.parametrize("kwargs, name", [
    (dict(bits=5), "key_bits"),
    (dict(key_bits=3, value_bits=0), "value_bits"),
    (dict(bits=4, window=-1), "window"),
    (dict(bits=4, seed=-1), "seed"),
    (dict(bits=4, layer=2**32), "layer"),
    (dict(bits=4, head_offset=-2), "head_offset"),
    (dict(bits=4, value_method="kivi", group_size=24), "group_size"),
    (dict(bits=4, value_method="zip"), "value_method"),
])
def test_bad_settings_rejected_at_construction(kwargs, name):
    with pytest.raises(ValueError, match=name):
        vc.TurboQuantKVCache(**kwargs)


def test_bad_trim_and_state():
    c = started("turboquant")
    snap = snapshot(c)
    for n in (-1, 1.5, True):
        with pytest.raises(ValueError, match="n:"):
            c.trim(n)
    assert_unchanged(c, snap)
    with pytest.raises(ValueError, match="state"):
        vc.TurboQuantKVCache.from_state([None, None, '{"format": 99}'])


@pytest.mark.parametrize("checks", CHECKS)
def test_window_token_is_checked_when_flushed(checks):
    # spec/streaming.md step 1: per-method rules apply to the tokens an append encodes; a float32 token
    # whose norm overflows is accepted while it sits in the window (R = 2) and rejects, atomically, every
    # append that would flush it, until a trim removes it.
    c = vc.TurboQuantKVCache(bits=4, window=2, checks=checks)
    good = rnd((1, 2, 4, 64), mx.float32, 1)
    c.update_and_fetch(good, good)
    c.update_and_fetch(good[:, :, :1], with_value(good[:, :, :1], 3e38))   # values token 4, in the window
    c.check()
    snap = snapshot(c)
    append_rejected(c, good[:, :, :2], good[:, :, :2], "values: x: norm overflows")   # would flush token 4
    assert_unchanged(c, snap)
    assert c.trim(1) == 1
    c.update_and_fetch(good[:, :, :2], good[:, :, :2])
    assert c.offset == 6
