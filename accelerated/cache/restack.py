"""Records moved between caches of B rows without decoding them, through their state arrays (the B-row batch cache's
merge, filter, extend, extract and finalize: accelerated/cache/batch_shared.py): rows taken, tokens cut at the
front, zero tokens put on the left, rows stacked one after another, rows rolled.

A stream's tokens are its encoded prefix, then its window (exact tokens, R > 0); left padding goes in front of
both parts, so a sequence's tokens keep the split its own cache has: no token is encoded or decoded here.
"""
from __future__ import annotations

import json
import typing

import mlx.core as mx

from .. import layouts
from .rotating import VeloxRotatingKVCache


def stream_split(stream) -> tuple[int, int]:
    """(encoded tokens, window tokens) of a stream (0, 0 before the first append)."""
    if stream is None:
        return 0, 0
    w = stream._window.shape[2]
    return stream.tokens - w, w


def layout(parts) -> int:
    """The encoded token count Q of one left-padded stream holding parts given as (padding, encoded, window) token
    counts, each part's encoded tokens ending at Q and its window following them (a stream's tokens are its encoded
    prefix, then its window): every part with encoded tokens must end them at the same position, and every other
    part's tokens must start at or after it. A fresh sequence's stream holds its newest min(T, R) tokens exactly, so
    any sequences of one configuration fit; a trim can leave one window short of R (ValueError)."""
    bounds = {pad + q for pad, q, _ in parts if q}
    if len(bounds) > 1:
        raise ValueError(f"parts: the encoded tokens end at different positions {sorted(bounds)} (a window trimmed "
                         "short in some of them): they do not fit one left-padded stream")
    q_end = min(pad for pad, q, _ in parts if not q) if not bounds else bounds.pop()
    if any(pad < q_end for pad, q, _ in parts if not q):
        raise ValueError("parts: a sequence's exact window reaches below the others' encoded tokens: they do not fit "
                         "one left-padded stream")
    return q_end


class Part(typing.NamedTuple):
    """Rows of one cache's record going into a restacked cache: its fields (None: no token), meta, row count,
    the rows taken (None: all), the first token taken and the zero tokens put on their left."""
    k: dict | None
    v: dict | None
    meta: dict
    nrows: int
    rows: list | None = None
    first: int = 0
    pad: int = 0

    @property
    def tokens(self) -> int:
        return self.pad + (self.meta["k"]["tokens"] - self.first if self.k is not None else 0)


def part_of(cache, pad: int = 0, rows=None, first: int = 0, nrows: int = 1) -> Part:
    """cache's record (checks settled) as a Part; `nrows`: its rows when it holds no token yet."""
    k, v, meta = cache.state
    meta = json.loads(meta)
    return Part(k, v, meta, k["window"].shape[0] if k is not None else nrows, rows, first, pad)


def restack(parts: list, like, offset: int | None = None):
    """One cache of type(like) holding the parts' rows one after another (every part the same token count after
    its padding); an empty cache of like's configuration if none has a token. `offset`: the tokens seen, where a
    sliding-window cache holds fewer (default: the tokens held). With an exact window (R > 0) the
    stream is its encoded prefix then its window: each part's encoded tokens are padded on the left to the common
    prefix and its window tokens to the common window (`layout`), so a sequence's tokens keep the split its own
    cache has (no token encoded or decoded here)."""
    tops = {p.tokens for p in parts}
    if len(tops) != 1:
        raise ValueError(f"parts: token counts after padding differ: {sorted(tops)}")
    top = tops.pop()
    ref = next((p for p in parts if p.k is not None), None)
    if ref is None or top == 0:
        return empty_like(like)
    if any(p.k is not None and "kept" in p.k for p in parts):     # exact-trim values: a per-sequence tail
        raise ValueError("parts: a record with kept tokens (an exact window or exact-trim tail) cannot be restacked")
    fields = []
    for role, params in (("k", like.key_params), ("v", like.value_params)):
        grouped = layouts.of(params).group_rows(role)       # KIVI keys' scale and zero: a row per G tokens
        # per part: the tokens it drops at the front (`first`) come off its encoded prefix, then off its window
        cuts = []
        for p in parts:
            f = getattr(p, role)
            if f is None:
                cuts.append((0, 0, 0, 0))
                continue
            w = f["window"].shape[2]
            q = p.meta[role]["tokens"] - w
            cut_q, cut_w = min(p.first, q), max(p.first - q, 0)
            cuts.append((cut_q, cut_w, q - cut_q, w - cut_w))
        q_top = layout([(p.tokens - q - w, q, w) for p, (_, _, q, w) in zip(parts, cuts)])
        out = {}
        for name, a_ref in getattr(ref, role).items():
            pieces = []
            want = top - q_top if name == "window" else q_top
            per = params.group_size if name in grouped else 1
            if want % per or any(c % per for c, _, _, _ in cuts):
                raise ValueError(f"parts: {name} holds a row per {per} tokens; the encoded tokens moved are no "
                                 "whole groups")
            want //= per
            for p, (cut_q, cut_w, _, _) in zip(parts, cuts):
                f = getattr(p, role)
                nb = len(p.rows) if p.rows is not None else p.nrows
                if f is None:
                    a = mx.zeros((nb, a_ref.shape[1], 0, *a_ref.shape[3:]), dtype=a_ref.dtype)
                else:
                    a = f[name]
                    if p.rows is not None and list(p.rows) != list(range(a.shape[0])):
                        a = a[mx.array(p.rows, dtype=mx.int32)]
                    cut = cut_w if name == "window" else cut_q // per
                    if cut:
                        a = a[:, :, cut:]
                if want > a.shape[2]:
                    a = mx.pad(a, [(0, 0), (0, 0), (want - a.shape[2], 0)] + [(0, 0)] * (a.ndim - 3))
                pieces.append(a)
            out[name] = mx.concatenate(pieces, axis=0) if len(pieces) > 1 else pieces[0]
        fields.append(out)
    meta = dict(ref.meta)
    seen = top if offset is None else offset
    meta.update(offset=seen, k={**meta["k"], "tokens": top}, v={**meta["v"], "tokens": top}, evicted=seen - top)
    meta["class"] = type(like).__name__
    return type(like).from_state((fields[0], fields[1], json.dumps(meta)))


def empty_like(cache):
    """A new empty cache with `cache`'s class and configuration."""
    meta = json.loads(cache.meta_state)
    for key in ("k", "v"):
        meta.pop(key, None)
    meta["offset"] = 0
    return type(cache).from_state((None, None, json.dumps(meta)))


def stack(caches: list, lp: list, idx: int, like):
    """(inner, rows held) of a B-row cache over single-sequence caches at left padding `lp` of `idx` positions. A
    sliding-window cache's stream holds the newest tokens only: every sequence's held tokens end at the stream's
    end (rows held: each sequence's count, which differ until the next update evicts them to one length), else the
    stream's positions are the batch's (rows held: None, each row holds its idx - lp tokens)."""
    if isinstance(like, VeloxRotatingKVCache):
        for c in caches:
            c._flush_step()          # a chunk a decode step left pending is among the held tokens
        held = [c._held() for c in caches]
        top = max(held)
        return restack([part_of(c, top - h) for c, h in zip(caches, held)], like, offset=idx), held
    return restack([part_of(c, p) for c, p in zip(caches, lp)], like), None


def rolled(cache, shifts: list[int]):
    """cache with each row's tokens rolled right by shifts[row] (mlx-lm's dynamic_roll at finalize: a right-padded
    prefill's padding moves to the front)."""
    k, v, meta = cache.state
    meta = json.loads(meta)
    t = meta["offset"]
    idx = (mx.arange(t)[None, :] - mx.array(shifts, dtype=mx.int32)[:, None]) % t     # (B, t)
    out = []
    for f in (k, v):
        g = {}
        for name, a in f.items():
            if name == "window":
                g[name] = a
                continue
            ix = idx.reshape(idx.shape[0], 1, t, *([1] * (a.ndim - 3)))
            g[name] = mx.take_along_axis(a, mx.broadcast_to(ix, a.shape), axis=2)
        out.append(g)
    return type(cache).from_state((out[0], out[1], json.dumps(meta)))


__all__ = ["Part", "part_of", "restack", "empty_like", "stack", "rolled", "layout", "stream_split"]
