"""accelerated.stream.Stream (spec/streaming.md): chunking invariance, trim, save/load, rejected appends."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import ops
from veloxquant.accelerated.stream import Stream

CASES = [
    ("turboquant", dict(bits=4, window=3)), ("turboquant_rvq", dict(bits=2, bits2=2, window=0)),
    ("turboquant_prod", dict(bits=3, window=2)), ("rabitq", dict(window=1)),
    ("kivi", dict(bits=2, group_size=16, role="k", window=5)), ("kivi", dict(bits=4, group_size=16, role="v", window=3)),
    ("mlx_affine", dict(bits=4, group_size=32, window=2)),
]
IDS = [f"{m}-{kw.get('role', '')}" for m, kw in CASES]


def _same(a: dict, b: dict) -> bool:
    def raw(v):  # compare bytes, bf16 included
        return np.array(v.view(mx.uint16) if v.dtype == mx.bfloat16 else v)
    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                                      and np.array_equal(raw(a[k]), raw(b[k])) for k in a)


def _chunks(rng, t):
    out, i = [], 0
    while i < t:
        n = int(rng.integers(1, 24))
        out.append((i, min(t, i + n)))
        i += n
    return out


@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_any_chunking_stores_the_one_shot_record(method, kw):
    rng = np.random.default_rng(1)
    p = spec.Params(method, **kw)
    x = mx.array(rng.standard_normal((2, 2, 75, 32)).astype(np.float32)).astype(mx.bfloat16)
    one_shot = ops.encode(x, p)
    for trial in range(3):
        s = Stream(p)
        for a, b in _chunks(rng, 75):
            s.append(x[:, :, a:b])
        assert s.tokens == 75
        assert _same(s.record(), one_shot)
        assert np.array_equal(np.array(s.dequantized()), np.array(ops.decode(one_shot, p)))
        assert s.nbytes == sum(v.nbytes for v in one_shot.values())


@pytest.mark.parametrize("method,kw", [c for c in CASES if c[0] != "kivi"], ids=[i for i in IDS if "kivi" not in i])
def test_per_token_trim_without_window_is_one_shot_of_survivors(method, kw):
    p = spec.Params(method, **{**kw, "window": 0})
    x = mx.array(np.random.default_rng(2).standard_normal((1, 3, 40, 64)).astype(np.float32))
    s = Stream(p)
    s.append(x)
    assert s.trim(13) == 13 and s.tokens == 27
    assert _same(s.record(), ops.encode(x[:, :, :27], p))
    assert s.trim(100) == 27 and s.tokens == 0


def test_kivi_trim_rewindows_decoded_tokens():
    p = spec.Params("kivi", bits=3, group_size=16, role="k", window=4)
    x = mx.array(np.random.default_rng(3).standard_normal((1, 2, 60, 32)).astype(np.float32)).astype(mx.float16)
    s = Stream(p)
    s.append(x)                                   # Q = 48, window 12
    full = s.dequantized()
    assert s.trim(30) == 30 and s.tokens == 30    # T' = 30: Q' = 16, tokens 16..29 re-windowed
    r = s.record()
    assert r["codes"].shape[2] == 16 and r["scale"].shape[2] == 1 and r["window"].shape[2] == 14
    assert r["window"].dtype == mx.float16
    assert np.array_equal(np.array(r["window"]), np.array(full[:, :, 16:30].astype(mx.float16)))


@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_save_load_then_continue_is_identical(method, kw):
    rng = np.random.default_rng(4)
    p = spec.Params(method, **kw)
    x = mx.array(rng.standard_normal((1, 2, 70, 32)).astype(np.float32)).astype(mx.float16)
    a, b = Stream(p), None
    a.append(x[:, :, :33])
    a.trim(6)
    arrays, meta = a.state()
    assert all(isinstance(v, (str, int)) for v in meta.values())
    saved = {k: mx.array(np.array(v)) for k, v in arrays.items()}  # a real copy, as if written to disk
    b = Stream.from_state(saved, dict(meta))
    assert _same(b.record(), a.record()) and b.tokens == a.tokens
    for s in (a, b):
        s.append(x[:, :, 33:50])
        s.trim(3)
        s.append(x[:, :, 50:])
    assert _same(b.record(), a.record())


@pytest.mark.parametrize("bad", [
    lambda: mx.ones((1, 2, 3, 32), dtype=mx.float32),            # dtype differs from the stream's
    lambda: mx.ones((1, 3, 3, 32), dtype=mx.float16),            # H differs
    lambda: mx.full((1, 2, 3, 32), float("nan"), dtype=mx.float16),
    lambda: mx.full((1, 2, 40, 32), 6e4, dtype=mx.float16) * mx.array([-1.0, 1.0] * 16, dtype=mx.float16),
])
def test_rejected_append_leaves_state_unchanged(bad):
    p = spec.Params("kivi", bits=1, group_size=16, role="v", window=0)  # last case: (M - m)/1 > fp16 max
    s = Stream(p, "float16")
    s.append(mx.array(np.random.default_rng(5).standard_normal((1, 2, 20, 32)).astype(np.float16)))
    before = s.record()
    with pytest.raises(ValueError, match="^x:"):
        s.append(bad())
    assert s.tokens == 20 and _same(s.record(), before)


def test_norm_overflow_rejected_only_when_flushed():
    p = spec.Params("turboquant", bits=2, window=2)
    s = Stream(p)
    s.append(mx.ones((1, 1, 1, 16)))
    s.append(mx.full((1, 1, 1, 16), 1e30))       # in the window: not encoded, accepted
    s.append(mx.ones((1, 1, 1, 16)))             # flushes token 0 only
    before = s.record()
    with pytest.raises(ValueError, match="^x: norm"):
        s.append(mx.ones((1, 1, 1, 16)))         # would flush the 1e30 token
    assert s.tokens == 3 and _same(s.record(), before)


def test_prepare_changes_nothing_and_commit_equals_append():
    """Stream.prepare checks and encodes without touching the state; commit(prepare(x)) == append(x)."""
    p = spec.Params("turboquant", bits=3, window=2)
    x = mx.array(np.random.default_rng(7).standard_normal((1, 2, 5, 32)).astype(np.float16))
    a, b = Stream(p), Stream(p)
    a.append(x[:, :, :3])
    b.append(x[:, :, :3])
    before = {k: np.array(v) for k, v in b.record().items()}
    pending = b.prepare(x[:, :, 3:])
    assert {k: np.array(v).tobytes() for k, v in b.record().items()} == \
        {k: v.tobytes() for k, v in before.items()}
    b.commit(pending)
    a.append(x[:, :, 3:])
    assert {k: np.array(v).tobytes() for k, v in a.record().items()} == \
        {k: np.array(v).tobytes() for k, v in b.record().items()}


def test_commit_refuses_a_stale_pending():
    """A pending prepared before another change (append, trim) would flush the wrong window."""
    p = spec.Params("kivi", bits=2, group_size=16, window=4)
    x = mx.array(np.random.default_rng(8).standard_normal((1, 1, 40, 16)).astype(np.float32))
    s = Stream(p)
    s.append(x[:, :, :20])
    stale = s.prepare(x[:, :, 20:30])
    s.trim(3)
    with pytest.raises(ValueError, match="^pending"):
        s.commit(stale)
    with pytest.raises(ValueError, match="^pending"):
        Stream(p).commit(s.prepare(x[:, :, 20:30]))
