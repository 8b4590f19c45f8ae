"""A cache over a shard of the KV heads (head_offset) stores, per head, the bytes of the unsharded cache
(spec/README.md 'Common parameters': randomness depends on the global head, never on local order)."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated.attention import PackedKV

CONFIGS = {
    "turboquant": (vc.TurboQuantKVCache, dict(bits=3)),
    "turboquant_rvq": (vc.TurboQuantRVQKVCache, dict(bits=2, bits2=1)),
    "turboquant_prod": (vc.TurboQuantProdKVCache, dict(bits=4)),
    "kivi": (vc.KIVIKVCache, dict(bits=3, group_size=16, window=4)),
    "rabitq": (vc.RaBitQKVCache, dict(bits=1)),
}


def as_bits(a: mx.array) -> np.ndarray:
    if isinstance(a, PackedKV):    # packed mode: compare the decoded record
        a = a.dequantized()
    return np.array(a.view({1: mx.uint8, 2: mx.uint16, 4: mx.uint32}[a.itemsize]))


def rnd(shape, seed):
    return mx.random.normal(shape, key=mx.random.key(seed)).astype(mx.bfloat16)


@pytest.mark.parametrize("method", list(CONFIGS))
@pytest.mark.parametrize("d", [64, 128])
def test_shard_stores_the_unsharded_bytes(method, d):
    cls, kw = CONFIGS[method]
    full = cls(**kw, seed=2**64 - 5, layer=9)
    lo = cls(**kw, seed=2**64 - 5, layer=9)                   # heads 0, 1
    hi = cls(**kw, seed=2**64 - 5, layer=9, head_offset=2)    # heads 2, 3
    unshifted = cls(**kw, seed=2**64 - 5, layer=9)            # heads 2, 3 fed without head_offset
    for i, t in enumerate((19, 1, 14)):
        k, v = rnd((2, 4, t, d), 2 * i), rnd((2, 4, t, d), 2 * i + 1)
        fk, fv = (a.dequantized() for a in full.update_and_fetch(k, v))   # packed views, decoded
        lo.update_and_fetch(k[:, :2], v[:, :2])
        hk, hv = hi.update_and_fetch(k[:, 2:], v[:, 2:])
        unshifted.update_and_fetch(k[:, 2:], v[:, 2:])
        np.testing.assert_array_equal(as_bits(hk), as_bits(fk[:, 2:]))
        np.testing.assert_array_equal(as_bits(hv), as_bits(fv[:, 2:]))
    for role in (0, 1):
        f, a, b = full.state[role], lo.state[role], hi.state[role]
        for name in f:
            np.testing.assert_array_equal(as_bits(a[name]), as_bits(f[name][:, :2]), err_msg=name)
            np.testing.assert_array_equal(as_bits(b[name]), as_bits(f[name][:, 2:]), err_msg=name)
    if method != "kivi":  # KIVI has no randomness: head_offset cannot change its bytes
        same = all(np.array_equal(as_bits(unshifted.state[0][n]), as_bits(hi.state[0][n]))
                   for n in hi.state[0] if n != "window")
        assert not same, "head_offset had no effect on the stored keys"
