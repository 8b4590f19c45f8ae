"""accelerated.cache against the mlx-lm 0.32 cache protocol (mlx_lm/models/cache.py, base.py).

Expected values come from independent paths: one-shot `accelerated.ops.encode/decode` of all tokens
(spec/streaming.md: any chunking stores the one-shot bytes), numpy's RNE cast, mlx-lm's own KVCache and
mask helpers.
"""
from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base as mlx_base
from mlx_lm.models import cache as mlx_cache

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated.attention import PackedKV
from veloxquant.accelerated import ops

# One setting per class; KIVI with a short window and G = 16 so groups get encoded in short tests.
CONFIGS = {
    "turboquant": (vc.TurboQuantKVCache, dict(bits=4)),
    "turboquant_rvq": (vc.TurboQuantRVQKVCache, dict(bits=2, bits2=3)),
    "turboquant_prod": (vc.TurboQuantProdKVCache, dict(bits=3)),
    "kivi": (vc.KIVIKVCache, dict(bits=2, group_size=16, window=4)),
    "rabitq": (vc.RaBitQKVCache, dict(bits=1)),
}
METHODS = list(CONFIGS)


def make(method, **kw):
    cls, base = CONFIGS[method]
    return cls(**{**base, "seed": 7, "layer": 3, **kw})


def chunk(shape, dtype=mx.float16, seed=0):
    return (mx.random.normal(shape, key=mx.random.key(seed)) * 2).astype(dtype)


def as_bits(a: mx.array) -> np.ndarray:
    """Raw bit patterns (numpy cannot hold bfloat16)."""
    if isinstance(a, PackedKV):    # packed mode: compare the decoded record
        a = a.dequantized()
    return np.array(a.view({1: mx.uint8, 2: mx.uint16, 4: mx.uint32}[a.itemsize]))


def assert_same_record(a: dict, b: dict):
    """Same fields, dtypes, shapes and bits; a cache state's "kept" tokens (streaming.md "Exact trims") are
    compared only against another state that has them (a one-shot record has none)."""
    if "kept" in a and "kept" not in b:
        a = {k: v for k, v in a.items() if k != "kept"}
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        np.testing.assert_array_equal(as_bits(a[name]), as_bits(b[name]), err_msg=name)


def fill(c, chunks=(13, 1, 7, 1, 1, 20), b=1, h=2, d=64, dtype=mx.float16):
    """Feed chunks of keys/values; return all keys and values fed (concatenated)."""
    ks, vs = [], []
    for i, t in enumerate(chunks):
        k, v = chunk((b, h, t, d), dtype, 2 * i), chunk((b, h, t, d), dtype, 2 * i + 1)
        kk, vv = c.update_and_fetch(k, v)
        ks.append(k), vs.append(v)
        total = sum(chunks[: i + 1])
        assert kk.shape == (b, h, total, d) and vv.shape == (b, h, total, d)
        assert kk.dtype == dtype and vv.dtype == dtype
        assert c.offset == total and c.size() == total
    return mx.concatenate(ks, axis=2), mx.concatenate(vs, axis=2)


@pytest.mark.parametrize("exact_trim", [None, 32])     # the default (0: no kept tokens) and exact trims
@pytest.mark.parametrize("method", METHODS)
def test_fetch_is_one_shot_decode_cast_rne(method, exact_trim):
    c = make(method) if exact_trim is None else make(method, exact_trim=exact_trim)
    assert c.empty() and c.offset == 0 and c.nbytes == 0
    keys, values = fill(c)
    assert not c.empty()
    k1, v1 = chunk((1, 2, 1, 64), seed=50), chunk((1, 2, 1, 64), seed=51)
    kk, vv = c.update_and_fetch(k1, v1)                         # one more token
    keys, values = mx.concatenate([keys, k1], axis=2), mx.concatenate([values, v1], axis=2)
    for x, got, p in ((keys, kk, c.key_params), (values, vv, c.value_params)):
        rec = ops.encode(x, p)
        dec = np.array(ops.decode(rec, p))                      # float32
        want = dec.astype(np.float16)                           # numpy's cast is RNE
        np.testing.assert_array_equal(as_bits(got), want.view(np.uint16))
    # The stored record is the one-shot record; beside it only the kept tokens (spec/streaming.md "Exact
    # trims": the newest C flushed tokens, exactly as appended; none for per-token methods with R = 0).
    k_rec, v_rec, _ = c.state
    nbytes = sum(a.nbytes for a in (*k_rec.values(), *v_rec.values()))
    for rec, x, p in ((k_rec, keys, c.key_params), (v_rec, values, c.value_params)):
        kept = rec.pop("kept", None)
        q = p.encoded_tokens(x.shape[2])
        if kept is None:
            assert p.kept_capacity() == 0 or (p.method != "kivi" and p.window == 0)
            assert (exact_trim is None) == (p.kept_capacity() == 0)
        else:
            assert kept.shape[2] == min(p.kept_capacity(), q) > 0
            np.testing.assert_array_equal(as_bits(kept), as_bits(x[:, :, q - kept.shape[2]:q]))
    assert_same_record(k_rec, ops.encode(keys, c.key_params))
    assert_same_record(v_rec, ops.encode(values, c.value_params))
    assert c.nbytes == nbytes


@pytest.mark.parametrize("method", METHODS)
def test_nbytes_below_fp16(method):
    c = make(method)
    fill(c, chunks=(64, 1, 1), h=2, d=128)
    ref = mlx_cache.KVCache()
    fill(ref, chunks=(64, 1, 1), h=2, d=128)
    fp16 = sum(a.nbytes for a in ref.keys_and_values())         # the valid tokens, not the step padding
    # the kept tokens (streaming.md "Exact trims") are a constant beside the record: at most C tokens per
    # stream in the input dtype, whatever the context length
    kept = [rec["kept"] for rec in c.state[:2] if "kept" in rec]
    assert all(k.shape[2] <= p.kept_capacity() for k, p in zip(kept, (c.key_params, c.value_params)))
    assert c.nbytes - sum(k.nbytes for k in kept) < 0.5 * fp16, (c.nbytes, fp16)


@pytest.mark.parametrize("method", METHODS)
def test_trim(method):
    c = make(method, window=0) if method != "kivi" else make(method)
    keys, values = fill(c)
    t = c.offset
    assert c.is_trimmable() and mlx_cache.can_trim_prompt_cache([c])
    assert mlx_cache.trim_prompt_cache([c], 5) == 5
    assert c.offset == t - 5
    if method != "kivi":
        # per-token methods, R = 0: the state is the one-shot record of the surviving tokens
        assert_same_record(c.state[0], ops.encode(keys[:, :, : t - 5], c.key_params))
        assert_same_record(c.state[1], ops.encode(values[:, :, : t - 5], c.value_params))
    kk, vv = c.update_and_fetch(keys[:, :, :2], values[:, :, :2])
    assert kk.shape[2] == c.offset == t - 3
    assert c.trim(10_000) == t - 3
    assert c.offset == 0 and c.nbytes == 0 and not c.empty()
    kk, _ = c.update_and_fetch(keys[:, :, :3], values[:, :, :3])
    assert kk.shape[2] == 3 and c.offset == 3
    with pytest.raises(ValueError, match="n:"):
        c.trim(-1)


@pytest.mark.parametrize("method", METHODS)
def test_state_round_trip_and_continue(method, tmp_path):
    c = make(method, head_offset=1)
    fill(c)
    meta = json.loads(c.meta_state)
    assert meta["class"] == type(c).__name__ and meta["offset"] == c.offset
    assert meta["key_params"]["layer"] == 3 and meta["key_params"]["head_offset"] == 1
    d = type(c).from_state(c.state)
    assert type(d) is type(c) and d.offset == c.offset and d.nbytes == c.nbytes
    assert_same_record(d.state[0], c.state[0])
    assert_same_record(d.state[1], c.state[1])
    # through mlx-lm's own save/load, next to a plain KVCache
    plain = mlx_cache.KVCache()
    plain.update_and_fetch(chunk((1, 2, 3, 64)), chunk((1, 2, 3, 64)))
    path = str(tmp_path / "pc.safetensors")
    mlx_cache.save_prompt_cache(path, [plain, c], metadata={"who": "test"})
    loaded, md = mlx_cache.load_prompt_cache(path, return_metadata=True)
    assert md == {"who": "test"} and type(loaded[0]) is mlx_cache.KVCache
    e = loaded[1]
    assert type(e) is type(c) and e.offset == c.offset and e.key_params == c.key_params
    assert_same_record(e.state[0], c.state[0])
    assert_same_record(e.state[1], c.state[1])
    k, v = chunk((1, 2, 17, 64), seed=90), chunk((1, 2, 17, 64), seed=91)
    for x in (c, d, e):
        x.out = x.update_and_fetch(k, v)
    for x in (d, e):
        for a, b in zip(x.out, c.out):
            np.testing.assert_array_equal(as_bits(a), as_bits(b))
        assert_same_record(x.state[0], c.state[0])


def test_empty_cache_state_round_trip(tmp_path):
    c = make("turboquant", key_bits=2, value_bits=3)
    path = str(tmp_path / "e.safetensors")
    mlx_cache.save_prompt_cache(path, [c])
    (e,) = mlx_cache.load_prompt_cache(path)
    assert e.empty() and e.offset == 0 and e.nbytes == 0
    assert (e.key_params.bits, e.value_params.bits) == (2, 3)
    with pytest.raises(ValueError, match="state"):
        vc.TurboQuantKVCache.from_state((None, None))


@pytest.mark.parametrize("n", [1, 5])
@pytest.mark.parametrize("window_size", [None, 4])
@pytest.mark.parametrize("return_array", [False, True])
def test_mask_matches_kvcache(n, window_size, return_array):
    c, ref = make("turboquant"), mlx_cache.KVCache()
    fill(c, chunks=(6,)), fill(ref, chunks=(6,))
    h = mx.zeros((1, n, 32))
    got = mlx_base.create_attention_mask(h, c, window_size=window_size, return_array=return_array)
    want = mlx_base.create_attention_mask(h, ref, window_size=window_size, return_array=return_array)
    if isinstance(want, mx.array):
        assert isinstance(got, mx.array)
        np.testing.assert_array_equal(np.array(got), np.array(want))
        np.testing.assert_array_equal(np.array(got), np.array(mlx_base.create_causal_mask(
            n, 6, window_size=window_size)))
    else:
        assert got == want


def test_bits_only_in_packed_mode_and_no_to_quantized():
    # mlx_lm.models.base.scaled_dot_product_attention sends caches with `bits` to
    # quantized_scaled_dot_product_attention (hooked: packed records go to accelerated.attention); a
    # dequantizing cache must not have it (its fetch returns plain arrays for mx.fast SDPA).
    # generate_step's maybe_quantize_kv_cache would replace caches that have `to_quantized`.
    for method in METHODS:
        c = make(method)
        assert c.attention == "packed" and hasattr(c, "bits") and hasattr(c, "group_size")
        d = make(method, attention="dequantize")
        assert not hasattr(d, "bits") and not hasattr(d, "group_size")
        assert not hasattr(c, "to_quantized") and not hasattr(d, "to_quantized")


def test_classes_registered_for_load_prompt_cache():
    for cls in vc.CACHE_CLASSES:
        assert getattr(mlx_cache, cls.__name__) is cls


def test_mixed_roles_and_settings():
    c = vc.VeloxKVCache(key_method="turboquant_prod", value_method="kivi", key_bits=4, value_bits=3,
                        group_size=16, window=0)
    assert (c.key_params.method, c.key_params.bits) == ("turboquant_prod", 4)
    assert (c.value_params.method, c.value_params.bits, c.value_params.group_size) == ("kivi", 3, 16)
    keys, values = fill(c, chunks=(16, 16))
    assert_same_record(c.state[0], ops.encode(keys, c.key_params))
    assert_same_record(c.state[1], ops.encode(values, c.value_params))


class _FakeModel:
    def __init__(self, n):
        self.layers = [object()] * n


def test_make_prompt_cache():
    caches = vc.make_prompt_cache(_FakeModel(5), method="kivi", bits=2, value_bits=4, group_size=16,
                                  window=8, fp16_layers=(1, 2), seed=11)
    assert [type(c).__name__ for c in caches] == ["KVCache", "KIVIKVCache", "KIVIKVCache", "KVCache",
                                                  "KVCache"]
    for layer in (1, 2):
        kp, vp = caches[layer].key_params, caches[layer].value_params
        assert (kp.layer, kp.seed, kp.bits, vp.bits, kp.window, kp.role, vp.role) == (
            layer, 11, 2, 4, 8, "k", "v")
    mixed = vc.make_prompt_cache(_FakeModel(2), key_method="turboquant", value_method="rabitq")
    assert all(type(c) is vc.VeloxKVCache for c in mixed)
    with pytest.raises(ValueError, match="fp16_layers"):
        vc.make_prompt_cache(_FakeModel(2), fp16_layers=(1,))
    with pytest.raises(ValueError, match="^bits:"):     # the caller passed bits, not key_bits
        vc.make_prompt_cache(_FakeModel(2), method="turboquant", bits=7)
    with pytest.raises(ValueError, match="^method:"):
        vc.make_prompt_cache(_FakeModel(2), method="nope")
