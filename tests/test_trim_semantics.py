"""What `trim(n)` restores, byte for byte (issue 33 item 4; spec/streaming.md 'What a trim restores', README).

A cache gets a prefill of T tokens, then a tokens one decode step at a time, then trim(n). It is compared
with a cache of the same settings that got only the T + a - n surviving tokens as one prefill:
- n <= min(E, a): every record array (encoded fields and the exact window) is byte-identical; the exact-trim
  copies ("kept") are a suffix of the other cache's, short by at most n tokens (kivi: n rounded up to whole
  groups), and nbytes is smaller by exactly the missing copies; with a = n, the record is the one before
  the appends;
- E = 0, per-token methods: nothing comes back into the window; every surviving token keeps the form it had
  (its record, or its exact value in the window), so the window holds fewer than R tokens.
"""
from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated.stream import Stream

D, H = 64, 2
X = mx.random.normal((1, H, 240, D), key=mx.random.key(7)).astype(mx.float16)


def make(method, exact_trim, **kw):
    return vc.VeloxKVCache(method=method, exact_trim=exact_trim, attention="dequantize", **kw)


def fed(method, exact_trim, prefill, steps, kw):
    c = make(method, exact_trim, **kw)
    c.update_and_fetch(X[:, :, :prefill], X[:, :, :prefill])
    for t in range(prefill, prefill + steps):
        c.update_and_fetch(X[:, :, t : t + 1], X[:, :, t : t + 1])
    return c


def split(state):
    """(record arrays by role and field, kept arrays by role) of cache.state."""
    rec, kept = {}, {}
    for role, arrays in zip("kv", state[:2]):
        arrays = dict(arrays)
        kept[role] = arrays.pop("kept", None)
        rec.update({(role, f): a for f, a in arrays.items()})
    return rec, kept


def same_bytes(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(np.array(a).view(np.uint8),
                                                                          np.array(b).view(np.uint8))


def n_kept(a) -> int:
    return 0 if a is None else a.shape[2]


CASES = [("turboquant", dict(window=8, bits=4)), ("turboquant", dict(window=0, bits=3)),
         ("turboquant_rvq", dict(window=5)), ("turboquant_prod", dict(window=3)), ("rabitq", dict(window=6)),
         ("mlx_affine", dict(window=4)), ("kivi", dict(window=16, group_size=32)),
         ("kivi", dict(window=0, group_size=32)), ("kivi", dict())]


@pytest.mark.parametrize("method,kw", CASES)
@pytest.mark.parametrize("exact_trim", [3, 20])
def test_trim_within_exact_trim_restores_the_record(method, kw, exact_trim):
    deficits = []
    p = make(method, exact_trim, **kw).key_params
    g = p.group_size if method == "kivi" else 1
    full = p.window + g - 1 + p.kept_capacity()     # the next token flushes, and C tokens are kept already
    for prefill, a in ((1, 4), (30, 3), (70, 20), (full, 1), (full, 4)):
        for n in sorted({0, 1, min(exact_trim, a) // 2, min(exact_trim, a)}):
            c = fed(method, exact_trim, prefill, a, kw)
            before = split(fed(method, exact_trim, prefill, 0, kw).state)
            assert c.trim(n) == n and c.offset == prefill + a - n
            ref = fed(method, exact_trim, prefill + a - n, 0, kw)
            (rec, kept), (ref_rec, ref_kept) = split(c.state), split(ref.state)
            where = f"{method} {kw} E={exact_trim} T={prefill} a={a} n={n}"
            assert rec.keys() == ref_rec.keys(), where
            for f in ref_rec:
                assert same_bytes(rec[f], ref_rec[f]), f"{where}: record field {f} differs"
            missing = 0
            for role in "kv":
                short = n_kept(ref_kept[role]) - n_kept(kept[role])
                assert 0 <= short <= g * -(-n // g), f"{where}: {role} kept {n_kept(kept[role])} vs " \
                                                     f"{n_kept(ref_kept[role])}"
                if n_kept(kept[role]):
                    assert same_bytes(kept[role], ref_kept[role][:, :, short:]), f"{where}: {role} kept not a suffix"
                missing += short
                deficits.append(short)
            assert c.nbytes == ref.nbytes - missing * H * D * 2, where
            if a == n:
                assert all(same_bytes(rec[f], before[0][f]) for f in before[0]), where
    if method == "kivi" or kw.get("window"):      # the stated shortfall happens (the bound above is not vacuous)
        assert max(deficits) > 0


@pytest.mark.parametrize("method,kw", [c for c in CASES if c[0] != "kivi" and c[1].get("window")])
def test_trim_without_exact_copies_moves_nothing_back(method, kw):
    """E = 0 (the default): the newest window tokens go first, then the newest records; nothing is decoded or
    moved back, so encoded tokens stay encoded and the window holds fewer than R tokens."""
    prefill, a, r = 40, 6, kw["window"]
    for n in (3, r + 5):              # within the window; past it (records of encoded tokens go too)
        c = fed(method, 0, prefill, a, kw)
        assert c.trim(n) == n
        t = prefill + a - n
        q = min(prefill + a - r, t)       # encoded tokens left
        rec, kept = split(c.state)
        assert kept == {"k": None, "v": None} and c.offset == t
        for role, params in (("k", c.key_params), ("v", c.value_params)):
            one = Stream(dataclasses.replace(params, window=0))   # per-token records of the first t tokens
            one.append(X[:, :, :t])
            for f, arr in one.record().items():
                want = X[:, :, q:t] if f == "window" else arr[:, :, :q]
                assert same_bytes(rec[(role, f)], want), f"{method} n={n}: {role}.{f}"
        assert rec[("k", "window")].shape[2] == t - q < r
