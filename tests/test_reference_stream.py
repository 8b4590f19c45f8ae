"""reference.stream.Stream against spec/streaming.md: chunking invariance, trim, save/load, rejection."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from veloxquant import spec
from veloxquant import reference
from veloxquant.reference import numerics
from veloxquant.reference.stream import Stream

CONFIGS = [
    spec.Params("turboquant", bits=3, window=0),
    spec.Params("turboquant", bits=4, window=5),
    spec.Params("turboquant_rvq", bits=2, bits2=3, window=3),
    spec.Params("turboquant_prod", bits=3, window=0),
    spec.Params("rabitq", window=4),
    spec.Params("kivi", bits=2, group_size=16, window=7, role="k"),
    spec.Params("kivi", bits=3, group_size=16, window=0, role="v"),
    spec.Params("mlx_affine", bits=4, group_size=32, window=6),
]
IDS = [f"{p.method}-{p.role}-R{p.window}" for p in CONFIGS]
T = 70


def tokens(dtype, seed=0, t=T):
    rng = np.random.default_rng(seed)
    xf = rng.standard_normal((2, 2, t, 32)).astype(np.float32)
    return {"float16": xf.astype(np.float16), "float32": xf,
            "bfloat16": (xf.view(np.uint32) >> 16).astype(np.uint16)}[dtype]


def same(a, b):
    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                                      and a[k].tobytes() == b[k].tobytes() for k in a)


def feed(stream, x, cuts):
    lo = 0
    for hi in list(cuts) + [x.shape[2]]:
        if hi > lo:
            stream.append(x[:, :, lo:hi])
            lo = hi


@pytest.mark.parametrize("p", CONFIGS, ids=IDS)
@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(1, T - 1), max_size=12, unique=True).map(sorted),
       dtype=st.sampled_from(spec.DTYPES))
def test_any_chunking_stores_one_shot_bytes(p, cuts, dtype):
    x = tokens(dtype)
    s = Stream(p, dtype)
    feed(s, x, cuts)
    assert s.tokens == T
    assert same(s.record(), reference.encode(x, p, dtype))


@pytest.mark.parametrize("p", [c for c in CONFIGS if c.method != "kivi"], ids=lambda p: p.method)
@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, T + 5), k=st.integers(1, 30))
def test_per_token_trim(p, n, k):
    """Window first, then newest encoded records; later appends follow the flush rule."""
    x = tokens("float32", 1)
    s = Stream(p, "float32")
    s.append(x)
    assert s.trim(n) == min(n, T)
    t1 = T - min(n, T)
    q_keep = min(max(T - p.window, 0), t1)
    # survivors: the encoded prefix is the first q_keep tokens, the window holds tokens q_keep..t1-1
    assert s.tokens == t1
    if t1:
        expect = reference.encode(x[:, :, :t1], dataclasses.replace(p, window=t1 - q_keep), "float32")
        assert same(s.record(), expect)
    if p.window == 0 and t1:
        assert same(s.record(), reference.encode(x[:, :, :t1], p, "float32"))
    # refill: the flush rule from the new state; per-token records do not depend on history
    y = tokens("float32", 2, k)
    s.append(y)
    joined = np.concatenate([x[:, :, :t1], y], axis=2)
    w_after = min(joined.shape[2] - q_keep, p.window)  # the window refills up to R, then flushes
    expect = reference.encode(joined, dataclasses.replace(p, window=w_after), "float32")
    assert same(s.record(), expect)


def test_kivi_trim_is_lossy_re_window():
    p = spec.Params("kivi", bits=2, group_size=16, window=4, role="k").resolved()
    x = tokens("float16", 3)
    s = Stream(p, "float16")
    s.append(x)                          # T = 70: Q = 64, window 6 tokens
    assert s.record()["window"].shape[2] == 6
    assert s.trim(30) == 30              # T' = 40: Q' = 32, tokens 32..39 come back decoded
    rec = s.record()
    assert s.tokens == 40
    full = reference.encode(x, p, "float16")
    assert np.array_equal(rec["codes"], full["codes"][:, :, :32])
    assert np.array_equal(rec["scale"], full["scale"][:, :, :2])
    dec = reference.decode(full, p, "float16")
    back = numerics.to_float16(dec[:, :, 32:40])
    assert np.array_equal(rec["window"], back)
    assert not np.array_equal(rec["window"], x[:, :, 32:40])  # lossy: not the original tokens
    # later appends flush whole groups from the new (decoded) window
    y = tokens("float16", 4, 20)         # window 8 + 20 = 28 >= R + G = 20: one group flushes
    s.append(y)
    rec2 = s.record()
    assert rec2["codes"].shape[2] == 48 and rec2["window"].shape[2] == 12
    win = np.concatenate([back, y], axis=2)
    grp = reference.encode(win[:, :, :16], dataclasses.replace(p, window=0), "float16")
    assert np.array_equal(rec2["codes"][:, :, 32:], grp["codes"])
    assert np.array_equal(rec2["zero"][:, :, 2:], grp["zero"])
    assert np.array_equal(rec2["window"], win[:, :, 16:])


def test_kivi_trim_within_window_is_lossless_and_to_group_boundary():
    p = spec.Params("kivi", group_size=16, window=10, role="v")
    x = tokens("float32", 5)
    s = Stream(p, "float32")
    s.append(x)                          # Q = 48, window 22
    s.trim(20)
    assert same(s.record(), reference.encode(x[:, :, :50], dataclasses.replace(p, window=2), "float32"))
    s.trim(2 + 16)                       # T' = 32: a group boundary, nothing comes back
    rec = s.record()
    assert rec["codes"].shape[2] == 32 and rec["window"].shape[2] == 0


def test_trim_contract():
    s = Stream(spec.Params("turboquant"), "float32")
    assert s.trim(3) == 0 and s.tokens == 0
    s.append(tokens("float32", 0, 5))
    assert s.trim(9) == 5 and s.tokens == 0
    assert s.record()["codes"].shape[2] == 0
    with pytest.raises(ValueError, match="^n:"):
        s.trim(-1)


@pytest.mark.parametrize("p", CONFIGS, ids=IDS)
def test_save_load_continue(p):
    x = tokens("bfloat16", 6)
    a = Stream(p, "bfloat16")
    a.append(x[:, :, :33])
    a.trim(5)
    b = Stream.from_state(a.state())
    assert same(a.record(), b.record()) and a.tokens == b.tokens
    a.append(x[:, :, 33:])
    b.append(x[:, :, 33:])
    assert same(a.record(), b.record())


@pytest.mark.parametrize("p", CONFIGS, ids=IDS)
def test_rejected_chunk_leaves_state_unchanged(p):
    s = Stream(p, "float32")
    x = tokens("float32", 7)
    s.append(x[:, :, :40])
    before = s.state()
    bad = [x[:, :, :3].astype(np.float16),                       # wrong dtype
           x[:, :1, :3],                                          # wrong H
           np.concatenate([x[:, :, :3], x[:, :, :3]], axis=3),    # wrong d
           x[0, :, :3],                                           # rank
           x[:, :, :0]]                                           # empty
    nan = x[:, :, :3].copy(); nan[0, 0, 1, 2] = np.nan
    bad.append(nan)
    if p.method != "mlx_affine":                                  # it has no range rule
        bad.append(np.full((2, 2, 40, 32), 1e20, np.float32))     # norm / float16 overflow once flushed
    for chunk in bad:
        with pytest.raises(ValueError, match="^x:"):
            s.append(chunk)
        after = s.state()
        assert after["tokens"] == before["tokens"] and same(after["record"], before["record"])
