"""accelerated.kernels.append on a GPU, through the caches: appends of one token (and small chunks) stored by
the one-launch path hold the bytes accelerated.ops's streams hold, across buffer growth (the general path
takes those steps), for every method the path serves, in float16 and bfloat16; a rejected chunk rolls
back. The kernel text itself runs on the CPU in tests/test_append_kernel_emulated.py."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import kernels
from veloxquant.accelerated.kernels.decode_step import DecodeStep
from veloxquant.accelerated import attention as vattention
from veloxquant.accelerated.kernels import append as fused
from veloxquant.accelerated.stream import Stream

GPU, WHY = kernels.available()
pytestmark = pytest.mark.skipif(not GPU, reason=f"fused kernels unavailable: {WHY}")

PAIRS = [("turboquant", "turboquant", dict(bits=4)), ("turboquant_rvq", "turboquant_prod", dict(bits=3, bits2=2)),
         ("rabitq", "mlx_affine", dict(key_bits=1, value_bits=4, group_size=64)),
         ("turboquant_prod", "rabitq", dict(key_bits=4, value_bits=1)),
         ("mlx_affine", "turboquant_rvq", dict(bits=2, bits2=2, group_size=32))]
CHUNKS = [3] + [1] * 10 + [5] + [1] * 240 + [1] * 6        # crosses the 256-row growth of the buffers


def _bytes(a: mx.array) -> np.ndarray:
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float16-specialized", "float16-apart", "float16-serial",
                                   "float16-attend", "bfloat16-attend"])
@pytest.mark.parametrize("mk,mv,kw", PAIRS, ids=[f"{a}-{b}" for a, b, _ in PAIRS])
def test_one_launch_appends_store_the_ops_bytes(mk, mv, kw, dtype, monkeypatch, tune):
    fused._static_for.cache_clear()                 # launch plans hold their template
    if dtype.endswith("-specialized"):          # every launch with its code constants compiled in
        tune(specialize_rows=0)
    if dtype.endswith(("-apart", "-serial")):   # the keys' and values' encodes side by side or in a row (tuning's roles_apart)
        tune(roles_apart=dtype.endswith("-apart"))
    attend = dtype.endswith("-attend")          # attention after every append: the append inside its partial launch
    tune(fuse_append=attend)
    dtype = dtype.split("-")[0]
    calls = []
    real, real_step = fused.append, DecodeStep.step    # the one-launch path: first append of a plan, then the step
    monkeypatch.setattr(fused, "append", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(DecodeStep, "step", lambda *a, **k: calls.append(1) or real_step(*a, **k))
    alone, real_flush = [], DecodeStep.flush      # pending appends launched on their own (not inside the attention)
    monkeypatch.setattr(DecodeStep, "flush", lambda self: (alone.append(1) if self.pending is not None else None)
                        or real_flush(self))
    cache = vc.VeloxKVCache(key_method=mk, value_method=mv, window=0, seed=5, layer=3, **kw)
    ref_k = Stream(cache.key_params, use_kernels=False)
    ref_v = Stream(cache.value_params, use_kernels=False)
    rng = np.random.default_rng(len(mk) + len(mv))
    t = 0
    for n in CHUNKS:
        k = mx.array(rng.standard_normal((2, 4, n, 64)).astype(np.float32)).astype(getattr(mx, dtype))
        v = mx.array(rng.standard_normal((2, 4, n, 64)).astype(np.float32)).astype(getattr(mx, dtype))
        kk, vv = cache.update_and_fetch(k, v)
        if attend:
            out = vattention.attend(mx.ones((2, 8, n, 64), dtype=k.dtype), kk, vv, 0.125,
                                    "causal" if n > 1 else None)
            mx.eval(out)
            assert bool(mx.all(mx.isfinite(out)).item()), f"{mk}/{mv}: attention output not finite"
        ref_k.append(k)
        ref_v.append(v)
        t += n
    assert len(calls) >= len(CHUNKS) - 3, f"one-launch path taken {len(calls)} of {len(CHUNKS)} appends"
    if attend:      # single-token steps store their chunk inside the attention launch (the causal chunks do not)
        assert len(alone) <= 4, f"{len(alone)} appends launched on their own with fuse_append"
    cache.check()
    for role, got, want in (("keys", cache._k.record(), ref_k.record()), ("values", cache._v.record(), ref_v.record())):
        for name in want:
            g, w = _bytes(got[name]), _bytes(want[name])
            assert g.shape == w.shape and np.array_equal(g, w), \
                f"{mk}/{mv} {dtype} {role}.{name}: {np.count_nonzero(g != w)} of {w.size} elements differ from accelerated.ops"
    assert cache.offset == t


def test_rejected_chunk_rolls_back():
    cache = vc.VeloxKVCache(method="turboquant", bits=4, window=0)
    good = lambda s: mx.random.normal((1, 8, 1, 128), key=mx.random.key(s)).astype(mx.float16)   # noqa: E731
    for s in range(4):
        cache.update_and_fetch(good(s), good(s + 10))
    mx.eval(cache.state)
    before = {n: _bytes(a) for n, a in cache._k.record().items()}
    bad = good(99) * float("inf")
    cache.update_and_fetch(bad, good(20))
    cache.update_and_fetch(good(21), good(22))
    with pytest.raises(ValueError, match=r"keys: x: contains NaN or Inf"):
        cache.check()
    assert cache.offset == 4
    after = cache._k.record()
    assert all(np.array_equal(before[n], _bytes(after[n])) for n in before)


@pytest.mark.parametrize("attend", [False, True], ids=["append", "attend"])
@pytest.mark.parametrize("window,dtype", [(32, "float16"), (128, "bfloat16"), (5, "float16"), (0, "float16"),
                                          (0, "bfloat16")])
def test_kivi_window_steps_store_the_ops_bytes(window, dtype, attend, monkeypatch, tune):
    """KIVI with an exact window on the one-launch path (copy-only steps, a group flush every G-th step): records,
    window and kept tokens hold accelerated.ops's bytes after every flush and at the end; with `attend` the append
    runs inside the attention's partial launch, whose output stays finite."""
    fused._static_for.cache_clear()
    tune(fuse_append=attend)
    steps = []
    real_step = DecodeStep.step
    monkeypatch.setattr(DecodeStep, "step", lambda *a, **k: steps.append(1) or real_step(*a, **k))
    cache = vc.VeloxKVCache(method="kivi", bits=2, window=window, exact_trim=8, seed=5, layer=3)
    ref_k = Stream(cache.key_params, use_kernels=False)
    ref_v = Stream(cache.value_params, use_kernels=False)
    rng = np.random.default_rng(window)
    g = cache.key_params.group_size
    for i, n in enumerate([window + 40] + [1] * 300):
        k = mx.array(rng.standard_normal((1, 4, n, 64)).astype(np.float32)).astype(getattr(mx, dtype))
        v = mx.array(rng.standard_normal((1, 4, n, 64)).astype(np.float32)).astype(getattr(mx, dtype))
        kk, vv = cache.update_and_fetch(k, v)
        if attend:
            out = vattention.attend(mx.ones((1, 8, n, 64), dtype=k.dtype), kk, vv, 0.125, "causal" if n > 1 else None)
            mx.eval(out)
            assert bool(mx.all(mx.isfinite(out)).item()), "attention output not finite"
        ref_k.append(k)
        ref_v.append(v)
        if i % g == 0 or i > 295:
            cache.check()
            for role, s, ref in (("keys", cache._k, ref_k), ("values", cache._v, ref_v)):
                got, want = s.record(), ref.record()
                for name in want:
                    a, b = _bytes(got[name]), _bytes(want[name])
                    assert a.shape == b.shape and np.array_equal(a, b), \
                        f"kivi R={window} {dtype} step {i} {role}.{name}: differs from accelerated.ops"
                assert np.array_equal(_bytes(s._kept), _bytes(ref._kept)), f"step {i} {role}: kept tokens"
    assert len(steps) >= 290, f"DecodeStep took {len(steps)} of 300 steps"
